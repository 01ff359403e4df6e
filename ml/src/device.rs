//! What a CUDA device needs from the machine beyond the driver, found and checked before any
//! kernel is compiled: the CUDA headers that cubecl's generated kernels include (NVRTC compiles
//! them against `$CUDA_PATH/include`), and a writable directory for the compiled-kernel and
//! autotune caches.
//!
//! cubecl-cuda panics ("CUDA installation not found") deep inside the first kernel launch when
//! it finds no toolkit, and a read-only root filesystem leaves it no cache, so every process
//! recompiles every kernel. These checks are plain file-system reads, so they run (and are
//! tested) on machines without a GPU.

use std::path::{Path, PathBuf};

/// The headers cubecl-cuda's kernels include (cubecl-cpp's CUDA dialect), relative to the include
/// directory. `cuda/*` are CCCL's (libcu++), which CUDA 13 moved under `include/cccl`: cubecl
/// adds that directory to NVRTC's include path when it exists.
pub const KERNEL_HEADERS: [&str; 8] = [
    "cuda_runtime.h",
    "cuda_fp16.h",
    "cuda_bf16.h",
    "mma.h",
    "cooperative_groups.h",
    "cuda/pipeline",
    "cuda/barrier",
    "cuda/ptx",
];

/// How cubecl picks a kernel for a matmul, reduction or fused shape in this build (the `autotune`
/// feature): with autotune it times every candidate once per shape (25-35 s a matmul shape on an
/// H200, cold); without, it takes cubek's `Strategy::Auto` and one thread per reduced output, so
/// a cold cache only compiles. Figures measured on a GPU are labelled with it, and
/// `scripts/gpu-check.sh check-bundle` reads it from the binaries to prove which they are.
pub const KERNEL_SELECTION: &str =
    if cfg!(feature = "autotune") { "kernel selection: autotune" } else { "kernel selection: no autotune" };

/// The environment variable naming the kernel cache directory (compiled kernels and autotune
/// results), for the worker and `dpctl`.
pub const KERNEL_CACHE_ENV: &str = "DPCAP_KERNEL_CACHE";

/// Where a CUDA toolkit was found, and why there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaRoot {
    /// The toolkit's root: its `include/` holds the headers.
    pub path: PathBuf,
    /// How it was found: "$CUDA_PATH" or the default location's path.
    pub found_by: String,
}

/// The toolkit root in the order cubecl-cuda searches: `$CUDA_PATH` when set, then
/// `/usr/local/cuda`, then `/opt/cuda`, then `/usr` when `/usr/bin/nvcc` exists (a distribution's
/// toolkit). `cuda_path` is the variable's value; `CUDA_HOME` is not read by cubecl.
pub fn find_cuda_root(cuda_path: Option<&str>) -> Option<CudaRoot> {
    if let Some(path) = cuda_path.filter(|p| !p.is_empty()) {
        return Some(CudaRoot { path: PathBuf::from(path), found_by: "$CUDA_PATH".into() });
    }
    let found = |path: &str| CudaRoot { path: PathBuf::from(path), found_by: path.to_owned() };
    let defaults = ["/usr/local/cuda", "/opt/cuda"].into_iter().find(|p| Path::new(p).is_dir()).map(found);
    defaults.or_else(|| Path::new("/usr/bin/nvcc").is_file().then(|| found("/usr")))
}

/// The [`KERNEL_HEADERS`] missing under `root/include` (a `cuda/*` header also counts when it
/// sits under `root/include/cccl`).
pub fn missing_headers(root: &Path) -> Vec<&'static str> {
    let include = root.join("include");
    KERNEL_HEADERS
        .into_iter()
        .filter(|h| {
            let in_cccl = h.starts_with("cuda/") && include.join("cccl").join(h).is_file();
            !(include.join(h).is_file() || in_cccl)
        })
        .collect()
}

/// Why a CUDA device cannot compile or cache kernels on this machine.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// No toolkit at all.
    #[error(
        "no CUDA toolkit: $CUDA_PATH is unset and neither /usr/local/cuda nor /opt/cuda exists; cubecl compiles \
         kernels with NVRTC against $CUDA_PATH/include: set CUDA_PATH to a toolkit (or to a directory whose \
         include/ holds the nvidia-cuda-runtime wheel's headers and CCCL)"
    )]
    NoToolkit,
    /// A toolkit without some of [`KERNEL_HEADERS`].
    #[error(
        "{} (from {found_by}) lacks {} under include/: kernels will not compile; point CUDA_PATH at a toolkit \
         with its headers (a -runtime image has none: use a -devel base or the wheels' include directories)",
        root.display(), missing.join(", ")
    )]
    MissingHeaders {
        /// The toolkit's root.
        root: PathBuf,
        /// How it was found.
        found_by: String,
        /// The headers it lacks.
        missing: Vec<&'static str>,
    },
    /// The kernel cache directory cannot be created or written.
    #[error(
        "kernel cache {} is not writable ({error}): every process would recompile every kernel; set \
         {KERNEL_CACHE_ENV} to a writable directory (in Kubernetes, a volume)", dir.display()
    )]
    CacheNotWritable {
        /// The directory.
        dir: PathBuf,
        /// What the file system said.
        error: std::io::Error,
    },
}

/// The toolkit whose headers the kernels will compile against, or why there is none usable.
pub fn check_headers(cuda_path: Option<&str>) -> Result<CudaRoot, DeviceError> {
    let root = find_cuda_root(cuda_path).ok_or(DeviceError::NoToolkit)?;
    let missing = missing_headers(&root.path);
    if missing.is_empty() {
        Ok(root)
    } else {
        Err(DeviceError::MissingHeaders { root: root.path, found_by: root.found_by, missing })
    }
}

/// Where compiled kernels and autotune results persist across processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelCache {
    /// The directory; created when missing.
    pub dir: PathBuf,
}

impl KernelCache {
    /// `$DPCAP_KERNEL_CACHE` when set (the value given), else `$XDG_CACHE_HOME/dpcap/kernels`,
    /// else `$HOME/.cache/dpcap/kernels`; `None` when none of them is set.
    pub fn from_env(value: Option<&str>, xdg_cache_home: Option<&str>, home: Option<&str>) -> Option<Self> {
        let nonempty = |v: Option<&str>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
        nonempty(value)
            .or_else(|| nonempty(xdg_cache_home).map(|d| d.join("dpcap/kernels")))
            .or_else(|| nonempty(home).map(|d| d.join(".cache/dpcap/kernels")))
            .map(|dir| Self { dir })
    }

    /// The cache this process's environment names.
    pub fn from_process_env() -> Option<Self> {
        let var = |name: &str| std::env::var(name).ok();
        Self::from_env(var(KERNEL_CACHE_ENV).as_deref(), var("XDG_CACHE_HOME").as_deref(), var("HOME").as_deref())
    }

    /// Creates the directory and proves it writable (a read-only root filesystem is the usual
    /// reason it is not: mount a volume there).
    pub fn check_writable(&self) -> Result<(), DeviceError> {
        let fail = |error| DeviceError::CacheNotWritable { dir: self.dir.clone(), error };
        std::fs::create_dir_all(&self.dir).map_err(fail)?;
        let probe = self.dir.join(format!(".probe-{}", std::process::id()));
        std::fs::write(&probe, b"").map_err(fail)?;
        std::fs::remove_file(&probe).map_err(fail)
    }
}

/// Points cubecl's compiled-kernel (PTX) and autotune caches at the [`KernelCache`] of this
/// process's environment, keeping whatever else `cubecl.toml` and the `CUBECL_*` variables
/// (`CUBECL_AUTOTUNE_LEVEL`) say. Without it cubecl caches no kernels and keeps autotune
/// results under `./target` or `~/.cache`, which a read-only container cannot write.
///
/// Call it before the first CUDA device is made: cubecl reads its configuration once. Returns
/// the directory, or `None` when there is none writable (then kernels compile in memory only)
/// or the configuration was already read.
#[cfg(feature = "cuda")]
pub fn configure_kernel_cache() -> Option<PathBuf> {
    use burn::cubecl::config::cache::CacheConfig;
    use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    let cache = KernelCache::from_process_env()?;
    if let Err(e) = cache.check_writable() {
        tracing::warn!("{e}");
        return None;
    }
    if CubeClRuntimeConfig::storage().lock().is_some() {
        tracing::warn!(dir = %cache.dir.display(), "cubecl's configuration was read before the kernel cache was set");
        return None;
    }
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    config.compilation.cache = Some(CacheConfig::File(cache.dir.clone()));
    config.autotune.cache = CacheConfig::File(cache.dir.clone());
    CubeClRuntimeConfig::set(config);
    tracing::info!(dir = %cache.dir.display(), "kernel and autotune caches");
    Some(cache.dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toolkit(headers: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for h in headers {
            let path = dir.path().join("include").join(h);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "").unwrap();
        }
        dir
    }

    #[test]
    fn cuda_path_wins_over_the_default_locations() {
        let root = find_cuda_root(Some("/somewhere/cuda")).unwrap();
        assert_eq!(root.path, PathBuf::from("/somewhere/cuda"));
        assert_eq!(root.found_by, "$CUDA_PATH");
    }

    #[test]
    fn a_toolkit_with_every_header_passes_and_cccl_headers_may_sit_under_include_cccl() {
        let flat = toolkit(&KERNEL_HEADERS);
        assert!(check_headers(flat.path().to_str()).is_ok());
        let mut cuda13: Vec<String> = KERNEL_HEADERS.iter().map(|h| h.to_string()).collect();
        cuda13.iter_mut().filter(|h| h.starts_with("cuda/")).for_each(|h| *h = format!("cccl/{h}"));
        let cuda13 = toolkit(&cuda13.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(missing_headers(cuda13.path()), Vec::<&str>::new());
    }

    #[test]
    fn a_runtime_only_install_fails_naming_each_missing_header_and_the_fix() {
        let runtime = toolkit(&["cuda_runtime.h"]);
        let err = check_headers(runtime.path().to_str()).unwrap_err().to_string();
        assert!(err.contains("cuda_fp16.h, cuda_bf16.h, mma.h, cooperative_groups.h, cuda/pipeline"), "{err}");
        assert!(err.contains("from $CUDA_PATH") && err.contains("-devel"), "{err}");
    }

    #[test]
    fn the_kernel_cache_comes_from_its_variable_then_the_xdg_cache_then_home() {
        let dir = |v, x, h| KernelCache::from_env(v, x, h).map(|c| c.dir);
        assert_eq!(dir(Some("/c"), Some("/x"), Some("/h")), Some(PathBuf::from("/c")));
        assert_eq!(dir(Some(""), Some("/x"), Some("/h")), Some(PathBuf::from("/x/dpcap/kernels")));
        assert_eq!(dir(None, None, Some("/h")), Some(PathBuf::from("/h/.cache/dpcap/kernels")));
        assert_eq!(dir(None, None, None), None);
    }

    #[test]
    fn a_kernel_cache_that_cannot_be_created_fails_naming_the_variable() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let cache = KernelCache { dir: file.path().join("kernels") };
        let err = cache.check_writable().unwrap_err().to_string();
        assert!(err.contains(KERNEL_CACHE_ENV) && err.contains("not writable"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        assert!(KernelCache { dir: dir.path().join("a/b") }.check_writable().is_ok());
    }
}
