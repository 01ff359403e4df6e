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
        let version = cudarc::nccl::result::get_nccl_version().map_err(|e| format!("ncclGetVersion: {e:?}"))?;
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
