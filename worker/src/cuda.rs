//! Preflight for the GPU path (feature `cuda`): cudarc loads libcuda and libnccl lazily and
//! panics when they are missing, and burn-cuda panics on a device that does not exist. These
//! checks turn both into errors that name the device before anything touches CUDA.

// FFI presence checks of the CUDA libraries through cudarc (no memory is touched).
#![allow(unsafe_code)]

/// Checks that the CUDA driver loads and that device `ordinal` exists.
pub fn check_device(ordinal: usize) -> Result<(), String> {
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
    Ok(())
}

/// Checks that NCCL loads (the NCCL reduction path).
pub fn check_nccl() -> Result<(), String> {
    // SAFETY: only probes whether the shared library can be opened.
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        Ok(())
    } else {
        // cudarc 0.19 asks for libnccl.so, .so.13, .so.12 … .so.9 and .so.1, never .so.2: the
        // only name Debian's libnccl2 and the nvidia-nccl-cu12/13 wheels install.
        Err("the NCCL library cannot be loaded under the names cudarc looks for (libnccl.so, libnccl.so.1, \
             libnccl.so.9 to .13); Debian's libnccl2 and the nvidia-nccl wheels install only libnccl.so.2: \
             link libnccl.so to it on the library path (deploy/Dockerfile.cuda does)"
            .to_owned())
    }
}
