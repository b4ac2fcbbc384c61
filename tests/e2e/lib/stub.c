/* Stand-in for an NVIDIA driver library in the e2e rig: a real ELF shared object with the
 * SONAME of the library it replaces (set by the linker), and a marker string the rig's
 * fakehw script uses to recognise its own files. It does nothing. */
const char e2e_fake_driver_marker[] = "e2e_fake_driver " E2E_LIB " " E2E_VERSION;
int e2e_fake_driver_version(void) { return 1; }
