//! Server reflection (v1 and v1alpha: grpcurl 1.8 speaks only v1alpha) over every dpcap proto
//! and grpc.health.v1, so that grpcurl needs no `.proto` files. Every dpcap server registers both.

use tonic_reflection::server::{Builder, Error, v1, v1alpha};

/// Builds the v1 and v1alpha reflection services advertising `served` (fully qualified names,
/// e.g. "dpcap.v1.JobService") and grpc.health.v1.Health: a server lists what it serves only.
#[allow(clippy::type_complexity)]
pub fn services(
    served: &[&str],
) -> Result<
    (
        v1::ServerReflectionServer<impl v1::ServerReflection>,
        v1alpha::ServerReflectionServer<impl v1alpha::ServerReflection>,
    ),
    Error,
> {
    let builder = || {
        let builder = Builder::configure()
            .register_encoded_file_descriptor_set(crate::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .with_service_name("grpc.health.v1.Health");
        served.iter().fold(builder, |b, name| b.with_service_name(*name))
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}
