//! FFI probes of the GPU path (feature `cuda`): cudarc loads libcuda, NVRTC and libnccl lazily
//! and panics when one is missing, and burn-cuda panics on a device that does not exist. These
//! probes turn each into an error that names the fix, before anything touches CUDA; the
//! preflight ([`crate::preflight`]) runs them all.

// FFI presence and version probes of the CUDA libraries through cudarc (no memory is touched).
#![allow(unsafe_code)]

/// The CUDA version cudarc's bindings were generated for, when the build pinned it
/// (`CUDARC_CUDA_VERSION=13000` for 13.0, as the driver encodes versions). Unpinned and without
/// nvcc, cudarc picks its newest bindings (13.4), which may call what an older driver lacks.
pub const BINDINGS_CUDA_VERSION: Option<&str> = option_env!("CUDARC_CUDA_VERSION");

/// Checks that the CUDA driver loads and that device `ordinal` exists; returns the driver's
/// CUDA version ("13.0") and the device count.
pub fn check_device(ordinal: usize) -> Result<String, String> {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(format!(
            "cuda:{ordinal}: the CUDA driver library (libcuda) cannot be loaded; is the NVIDIA driver installed and visible?"
        ));
    }
    let count = cudarc::driver::CudaContext::device_count()
        .map_err(|e| format!("cuda:{ordinal}: the CUDA driver failed to initialise: {e:?}"))?;
    if ordinal >= count.max(0) as usize {
        return Err(format!("cuda:{ordinal} does not exist: {count} CUDA device(s) visible"));
    }
    let mut version = 0;
    // SAFETY: the driver is loaded and initialised (device_count above); writes one int.
    let status = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
    if status != cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        return Err(format!("cuda:{ordinal}: cuDriverGetVersion failed: {status:?}"));
    }
    let name = |v: i32| format!("{}.{}", v / 1000, v % 1000 / 10);
    let bindings = match BINDINGS_CUDA_VERSION.and_then(|v| v.parse::<i32>().ok()) {
        Some(pinned) if pinned > version => {
            return Err(format!(
                "cuda:{ordinal}: this binary's CUDA bindings are for CUDA {} but the driver supports only {}: \
                 rebuild with CUDARC_CUDA_VERSION={version} (or upgrade the driver)",
                name(pinned),
                name(version)
            ));
        }
        Some(pinned) => format!("bindings for CUDA {}", name(pinned)),
        None => "bindings unpinned (CUDARC_CUDA_VERSION unset at build)".to_owned(),
    };
    Ok(format!("driver supports CUDA {}; {bindings}; {count} device(s)", name(version)))
}

/// Checks that NVRTC (the runtime compiler cubecl builds every kernel with) loads; returns its
/// version.
pub fn check_nvrtc() -> Result<String, String> {
    // SAFETY: only probes whether the shared library can be opened.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err("NVRTC (libnvrtc.so) cannot be loaded: kernels cannot be compiled; install the toolkit's \
                    NVRTC or the nvidia-cuda-nvrtc wheel and put its lib directory on LD_LIBRARY_PATH, with a \
                    libnvrtc.so link to libnvrtc.so.N"
            .to_owned());
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is loaded; writes two ints.
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if status != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(format!("nvrtcVersion failed: {status:?}"));
    }
    Ok(format!("NVRTC {major}.{minor}"))
}

/// Checks that NCCL loads (the NCCL reduction path).
pub fn check_nccl() -> Result<String, String> {
    // SAFETY: only probes whether the shared library can be opened.
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        // The communicators are non-blocking, which needs NCCL 2.22 or newer; refusing an older
        // library here names it before the model is built.
        let version = cudarc::nccl::result::get_nccl_version()
            .map_err(|e| format!("ncclGetVersion failed: {:?} (ncclResult_t {})", e.0, e.0 as u32))?;
        crate::collective::settle::config_bytes(version).map_err(|e| e.to_string())?;
        Ok(format!("NCCL {}.{}.{} loads", version / 10000, version / 100 % 100, version % 100))
    } else {
        // cudarc 0.19 asks for libnccl.so, .so.13, .so.12 … .so.9 and .so.1, never .so.2: the
        // only name Debian's libnccl2 and the nvidia-nccl-cu12/13 wheels install.
        Err("the NCCL library cannot be loaded under the names cudarc looks for (libnccl.so, libnccl.so.1, \
             libnccl.so.9 to .13); Debian's libnccl2 and the nvidia-nccl wheels install only libnccl.so.2: \
             link libnccl.so to it on the library path (deploy/Dockerfile.cuda and scripts/gpu-check.sh do)"
            .to_owned())
    }
}

/// The headers cubecl's CUDA dialect includes (`cubecl-cpp` `cuda/dialect.rs`), in one kernel:
/// a missing header, or an NVRTC that cannot load its builtins library, fails here.
const PROBE_KERNEL: &str = r#"
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
#include <cooperative_groups.h>
#include <cooperative_groups/memcpy_async.h>
#include <cuda/pipeline>
#include <cuda/barrier>
#include <cuda/ptx>
extern "C" __global__ void dpcap_probe(float* x) {
    x[threadIdx.x] = __bfloat162float(__float2bfloat16(x[threadIdx.x])) + 1.0f;
}
"#;

/// The NVRTC options cubecl-cuda compiles every kernel with (`compute/context.rs`): the
/// device's architecture (`sm_90a` from Hopper on), `$CUDA_PATH/include`, and its `cccl`
/// directory when it exists (CUDA 13 keeps libcu++ there).
pub fn cubecl_options(capability: (i32, i32), include: &std::path::Path) -> Vec<String> {
    let version = capability.0 * 10 + capability.1;
    let suffix = if version >= 90 { "a" } else { "" };
    let mut options = vec![
        format!("--gpu-architecture=sm_{version}{suffix}"),
        format!("--include-path={}", include.display()),
        "-lineinfo".to_owned(),
    ];
    let cccl = include.join("cccl");
    if cccl.is_dir() {
        options.push(format!("--include-path={}", cccl.display()));
    }
    options
}

/// Compiles a one-line kernel with cubecl's own options against `cuda_root`'s headers, loads
/// it on device `ordinal` and runs it on 32 values: what every cubecl kernel needs (NVRTC, its
/// builtins library, the headers, the driver's PTX JIT) proven in a second, before a model
/// is built. Returns the architecture it compiled for.
pub fn check_kernel(ordinal: usize, cuda_root: &std::path::Path) -> Result<String, String> {
    use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
    let ctx = CudaContext::new(ordinal).map_err(|e| format!("cuda:{ordinal}: cannot create a context: {e}"))?;
    let capability = ctx.compute_capability().map_err(|e| format!("cuda:{ordinal}: compute capability: {e}"))?;
    let options = cubecl_options(capability, &cuda_root.join("include"));
    let arch = options[0].trim_start_matches("--gpu-architecture=").to_owned();
    let compile = cudarc::nvrtc::CompileOptions { options, ..Default::default() };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(PROBE_KERNEL, compile).map_err(compile_failure)?;
    let module =
        ctx.load_module(ptx).map_err(|e| format!("the driver refused the probe kernel's PTX ({arch}): {e}"))?;
    let function = module.load_function("dpcap_probe").map_err(|e| format!("probe kernel: {e}"))?;
    let stream = ctx.default_stream();
    let input: Vec<f32> = (0..32).map(|i| i as f32).collect();
    let mut values = stream.clone_htod(&input).map_err(|e| format!("probe upload: {e}"))?;
    let config = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
    let mut launch = stream.launch_builder(&function);
    launch.arg(&mut values);
    // SAFETY: the kernel takes one float* and writes threadIdx.x < 32 of the 32 values.
    unsafe { launch.launch(config) }.map_err(|e| format!("probe kernel launch: {e}"))?;
    let output = stream.clone_dtoh(&values).map_err(|e| format!("probe download: {e}"))?;
    if output.iter().zip(&input).any(|(out, x)| *out != x + 1.0) {
        return Err(format!("the probe kernel computed wrong values on cuda:{ordinal}: {:?}", &output[..4]));
    }
    Ok(format!("a kernel compiled for {arch} with cubecl's options, loaded and ran"))
}

/// NVRTC's refusal, with the first lines of its log and the fix for the usual causes.
fn compile_failure(error: cudarc::nvrtc::CompileError) -> String {
    let (code, log) = match &error {
        cudarc::nvrtc::CompileError::CompileError { nvrtc, log, .. } => {
            (format!("{:?}", nvrtc.0), log.to_string_lossy().lines().take(6).collect::<Vec<_>>().join(" | "))
        }
        other => (format!("{other:?}"), String::new()),
    };
    format!(
        "NVRTC could not compile a kernel with cubecl's options ({code}: {log}); a missing libnvrtc-builtins \
         needs the directory of libnvrtc.so.N (which holds libnvrtc-builtins.so.N.M) on LD_LIBRARY_PATH, and a \
         missing header a CUDA_PATH whose include/ has the toolkit's headers"
    )
}
