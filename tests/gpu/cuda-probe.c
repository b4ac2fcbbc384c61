/* What a CUDA workload does first, with nothing of CUDA in its image: dlopen libcuda.so.1 by
 * SONAME (the CDI spec must have brought it and the loader must find it), JIT-compile a PTX
 * kernel (libnvidia-ptxjitcompiler must be there too), run it on every GPU the container sees and
 * check every element it wrote.
 *
 *   cuda-probe          one line per GPU ("GPU <n> <name>: kernel OK, <N> elements checked"),
 *                       then "CUDA-PROBE OK <gpus>"; exit 0 only if every GPU ran the kernel right
 *   cuda-probe noop     exit 0 at once (container creation cost)
 *
 * Built by tests/gpu/kit.sh with Debian 12's gcc against Debian 12's glibc, which the kit's
 * image carries. No CUDA header: the few driver API entry points are declared here with the
 * types of cuda.h (CUresult = int, CUdevice = int, handles are pointers, CUdeviceptr is 64-bit).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;
typedef unsigned long long CUdeviceptr;

/* out[i] = 3 * i + 7 for i < n: every element depends on its index, so a kernel that did not
 * run, ran partly or ran on the wrong buffer is caught. PTX ISA 7.0 for sm_50: the driver
 * JIT-compiles it for whatever GPU is there. */
static const char PTX[] =
    ".version 7.0\n"
    ".target sm_50\n"
    ".address_size 64\n"
    ".visible .entry fill(.param .u64 p_out, .param .u32 p_n)\n"
    "{\n"
    "  .reg .pred p;\n"
    "  .reg .b32 r<8>;\n"
    "  .reg .b64 rd<5>;\n"
    "  ld.param.u64 rd1, [p_out];\n"
    "  ld.param.u32 r1, [p_n];\n"
    "  mov.u32 r2, %ctaid.x;\n"
    "  mov.u32 r3, %ntid.x;\n"
    "  mov.u32 r4, %tid.x;\n"
    "  mad.lo.s32 r5, r2, r3, r4;\n"
    "  setp.ge.u32 p, r5, r1;\n"
    "  @p bra DONE;\n"
    "  cvta.to.global.u64 rd2, rd1;\n"
    "  mul.wide.u32 rd3, r5, 4;\n"
    "  add.s64 rd4, rd2, rd3;\n"
    "  mad.lo.s32 r6, r5, 3, 7;\n"
    "  st.global.u32 [rd4], r6;\n"
    "DONE:\n"
    "  ret;\n"
    "}\n";

#define N (1u << 20)
#define THREADS 256u

static void *sym(void *h, const char *name) {
    void *f = dlsym(h, name);
    if (!f) {
        printf("CUDA-PROBE FAIL: libcuda.so.1 has no %s\n", name);
        exit(1);
    }
    return f;
}

static CUresult (*get_error_string)(CUresult, const char **);

static const char *why(CUresult r) {
    const char *s = 0;
    if (get_error_string && get_error_string(r, &s) == 0 && s) return s;
    return "unknown error";
}

#define CHECK(call)                                                                   \
    do {                                                                              \
        CUresult r_ = (call);                                                         \
        if (r_ != 0) {                                                                \
            printf("CUDA-PROBE FAIL: %s: error %d (%s)\n", #call, r_, why(r_));       \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "noop") == 0) return 0;
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        printf("CUDA-PROBE FAIL: dlopen libcuda.so.1: %s\n", dlerror());
        return 1;
    }
    Dl_info info;
    CUresult (*cu_init)(unsigned) = sym(h, "cuInit");
    if (dladdr((void *)cu_init, &info) && info.dli_fname)
        printf("libcuda.so.1 is %s\n", info.dli_fname);
    get_error_string = sym(h, "cuGetErrorString");
    CUresult (*driver_version)(int *) = sym(h, "cuDriverGetVersion");
    CUresult (*device_count)(int *) = sym(h, "cuDeviceGetCount");
    CUresult (*device_get)(CUdevice *, int) = sym(h, "cuDeviceGet");
    CUresult (*device_name)(char *, int, CUdevice) = sym(h, "cuDeviceGetName");
    CUresult (*ctx_create)(CUcontext *, unsigned, CUdevice) = sym(h, "cuCtxCreate_v2");
    CUresult (*ctx_destroy)(CUcontext) = sym(h, "cuCtxDestroy_v2");
    CUresult (*module_load)(CUmodule *, const void *) = sym(h, "cuModuleLoadData");
    CUresult (*module_function)(CUfunction *, CUmodule, const char *) = sym(h, "cuModuleGetFunction");
    CUresult (*mem_alloc)(CUdeviceptr *, size_t) = sym(h, "cuMemAlloc_v2");
    CUresult (*mem_free)(CUdeviceptr) = sym(h, "cuMemFree_v2");
    CUresult (*memset_d32)(CUdeviceptr, unsigned, size_t) = sym(h, "cuMemsetD32_v2");
    CUresult (*copy_dtoh)(void *, CUdeviceptr, size_t) = sym(h, "cuMemcpyDtoH_v2");
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, void *, void **, void **) = sym(h, "cuLaunchKernel");
    CUresult (*synchronize)(void) = sym(h, "cuCtxSynchronize");

    CHECK(cu_init(0));
    int version = 0, count = 0;
    CHECK(driver_version(&version));
    CHECK(device_count(&count));
    printf("CUDA driver API %d.%d, %d GPU(s)\n", version / 1000, version % 1000 / 10, count);
    if (count < 1) {
        printf("CUDA-PROBE FAIL: no GPU visible\n");
        return 1;
    }
    uint32_t *host = malloc(N * sizeof *host);
    if (!host) return 1;
    for (int g = 0; g < count; g++) {
        CUdevice dev;
        CUcontext ctx;
        CUmodule mod;
        CUfunction fn;
        CUdeviceptr buf;
        char name[256] = {0};
        CHECK(device_get(&dev, g));
        CHECK(device_name(name, sizeof name - 1, dev));
        CHECK(ctx_create(&ctx, 0, dev));
        CHECK(module_load(&mod, PTX));
        CHECK(module_function(&fn, mod, "fill"));
        CHECK(mem_alloc(&buf, N * sizeof *host));
        CHECK(memset_d32(buf, 0xdeadbeefu, N));
        unsigned n = N;
        void *params[] = {&buf, &n};
        CHECK(launch(fn, (N + THREADS - 1) / THREADS, 1, 1, THREADS, 1, 1, 0, 0, params, 0));
        CHECK(synchronize());
        memset(host, 0, N * sizeof *host);
        CHECK(copy_dtoh(host, buf, N * sizeof *host));
        for (uint32_t i = 0; i < N; i++) {
            if (host[i] != 3 * i + 7) {
                printf("CUDA-PROBE FAIL: GPU %d element %u is %u, not %u\n", g, i, host[i],
                       3 * i + 7);
                return 1;
            }
        }
        CHECK(mem_free(buf));
        CHECK(ctx_destroy(ctx));
        printf("GPU %d %s: kernel OK, %u elements checked\n", g, name, N);
    }
    printf("CUDA-PROBE OK %d\n", count);
    return 0;
}
