//! The plumbing every dpcap server and client shares, in one place: TLS ([`tls`]), bearer-token
//! roles on every RPC ([`auth`]), the rule that an exposed port needs both ([`exposure`]), the
//! server builder that applies them ([`security`]), object stores by URL ([`store`]), the
//! metrics port ([`metrics_http`]), logging, signals and address files ([`process`]), the
//! drain every server runs at shutdown ([`drain`]), and the job-scoped capabilities workers
//! carry to the accountant ([`capability`]).
//!
//! It owns no service logic and no privacy math, and it must never log a credential.

pub mod auth;
pub mod capability;
pub mod drain;
mod exposure;
mod metrics_http;
pub mod plaintext;
pub mod process;
mod security;
pub mod store;
mod tls;

pub use auth::{Credentials, Role};
pub use capability::{Capabilities, Capability, CapabilityArgs, KeyRing, StepGrant};
pub use dpcap_proto::client::AttachToken;
pub use metrics_http::{sample, serve_http};
pub use process::Listeners;
pub use security::{AuthArgs, SecuredServer, SecurityError, ServerSecurity};
pub use store::{StoreError, StoreProblem, open_durable_store, open_existing_store, open_store, open_store_with};
pub use tls::{ClientTlsArgs, ServerTlsArgs, TlsError};
