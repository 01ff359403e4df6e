//! dpcap's machine learning: models with per-example losses (the DP-Cap captioner, ViP's MAE,
//! DP-FedEmb's embedder), the ClipEngine that turns a logical batch into Σ_i clip_C(g_i), the
//! optimizer, a rank's replica ([`trainer`]), DP-FedEmb's client updates, checkpoints and
//! exports (safetensors, timm), and the evaluation suite.
//!
//! It is generic over burn autodiff backends (`Autodiff<Flex>` on CPU, `Autodiff<Cuda>` with
//! the `cuda` feature) and holds no networking: the worker runtime drives it, and `dpctl` uses
//! it offline. It must never add noise or divide by a realised batch size: noise is the
//! accountant's, and updates divide the accountant's release by the *expected* batch size.

pub mod alloc;
pub mod checkpoint;
pub mod clip;
pub mod device;
mod error;
pub mod eval;
pub mod fed;
pub mod fused;
pub mod init;
pub mod model;
pub mod optim;
pub mod params;
pub mod timm;
pub mod trainer;

pub use error::MlError;

/// The CPU training backend.
pub type CpuBackend = burn::backend::Autodiff<burn::backend::Flex>;

/// The CUDA training backend (feature `cuda`).
#[cfg(feature = "cuda")]
pub type CudaBackend = burn::backend::Autodiff<burn::backend::Cuda>;

/// burn-wgpu with autodiff: the JIT path (cubecl IR, fusion, autotune) on any Vulkan device,
/// Mesa's lavapipe included, so that CUDA's kernels' shared machinery runs without a GPU.
#[cfg(feature = "wgpu")]
pub type WgpuBackend = burn::backend::Autodiff<burn::backend::Wgpu>;
