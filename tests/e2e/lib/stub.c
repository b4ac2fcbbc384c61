/* Stand-in for an NVIDIA driver library in the e2e rig: a real ELF shared object with the
 * SONAME of the library it replaces (set by the linker), and a marker string the rig's
 * fakehw script uses to recognise its own files. It does nothing. */
const char e2e_fake_driver_marker[] = "e2e_fake_driver " E2E_LIB " " E2E_VERSION;
int e2e_fake_driver_version(void) { return 1; }
/* What NVIDIA's nvidia-ctk (scenario 17) calls first in libnvidia-ml: it goes on without NVML when
 * the init fails, as on a host without the kernel module (9: NVML_ERROR_DRIVER_NOT_LOADED). */
int nvmlInit(void) { return 9; }
int nvmlInit_v2(void) { return 9; }
int nvmlInitWithFlags(unsigned int flags) { (void)flags; return 9; }
int nvmlShutdown(void) { return 0; }
const char *nvmlErrorString(int result) { (void)result; return "driver not loaded (e2e stand-in)"; }
