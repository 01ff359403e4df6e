//! DP-FedEmb's training settings, typed, with their defaults written once: the coordinator
//! plans with them (the server's learning rate, users per client), the workers train with them.

/// How the server applies the averaged clipped client deltas.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ServerOptimizer {
    /// SGD with momentum (FedAvg applies the average delta as it is at learning rate 1).
    Sgd {
        /// Momentum, in [0, 1).
        momentum: f64,
    },
    /// Adam (no weight decay).
    Adam,
}

/// A DP-FedEmb job's settings, every default filled in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FedEmb {
    /// SGD steps on each sampled client; 0: as many as `local_epochs` take.
    pub local_steps: u32,
    /// Passes over a client's examples when `local_steps` is 0 (at least 1).
    pub local_epochs: u32,
    /// Local SGD learning rate (on the mean loss of a local batch).
    pub local_learning_rate: f64,
    /// Examples per local step.
    pub local_batch: u32,
    /// Users per virtual client (the unit sampled and clipped); 1: each user its own client.
    pub users_per_client: u32,
    /// s in s·cos(e, p_c): the local cosine head's softmax scale.
    pub head_scale: f64,
    /// The server's optimizer.
    pub server: ServerOptimizer,
}

impl FedEmb {
    /// DP-FedEmb's defaults: one local epoch of batches of 8 at 0.05, each user its own client,
    /// s = 10, server SGD with momentum 0.9.
    pub const DEFAULT: FedEmb = FedEmb {
        local_steps: 0,
        local_epochs: 1,
        local_learning_rate: 0.05,
        local_batch: 8,
        users_per_client: 1,
        head_scale: 10.0,
        server: ServerOptimizer::Sgd { momentum: 0.9 },
    };

    /// The server's peak learning rate when the spec gives none: 1 for SGD (the average delta
    /// as it is), Adam's 1e-3.
    pub fn server_learning_rate(&self) -> f64 {
        match self.server {
            ServerOptimizer::Sgd { .. } => 1.0,
            ServerOptimizer::Adam => 1e-3,
        }
    }
}

impl Default for FedEmb {
    fn default() -> Self {
        Self::DEFAULT
    }
}
