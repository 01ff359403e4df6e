//! dpcap's worker: models with per-example losses, the ClipEngine that turns a logical batch
//! into Σ_i clip_C(g_i), the optimizer, checkpoints, data, and the step runtime (register,
//! clip, submit the part, fetch the release, update, report); and DP-FedEmb's client updates.
//!
//! It is generic over burn autodiff backends (`Autodiff<Flex>` on CPU, `Autodiff<Cuda>` with
//! the `cuda` feature). It must never add noise or divide by a realised batch size: noise is the
//! accountant's, and updates divide the accountant's release by the *expected* batch size.

pub mod checkpoint;
pub mod clip;
pub mod collective;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod data;
pub mod eval;
pub mod fed;
pub mod model;
pub mod optim;
pub mod params;
pub mod runtime;
pub mod timm;

/// The default CPU training backend.
pub type CpuBackend = burn::backend::Autodiff<burn::backend::Flex>;

/// The CUDA training backend (feature `cuda`).
#[cfg(feature = "cuda")]
pub type CudaBackend = burn::backend::Autodiff<burn::backend::Cuda>;
