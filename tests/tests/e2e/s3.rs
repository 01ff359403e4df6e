//! The product on S3, as platform teams run it: datasets, the ledger, the job store, job
//! secrets and checkpoints in buckets of a real S3-protocol server (moto, `dpcap_e2e::s3`), read
//! and written by the shipped binaries through object_store's S3 client.

use std::path::Path;
use std::time::Duration;

use dpcap_e2e::jobs::{ended, spec, spend, submit, tempfile_dir, wait_until, within};
use dpcap_e2e::s3::S3Server;
use dpcap_e2e::{Cluster, Process, Services, dpctl_with_env, synth_shards};
use dpcap_proto::v1::JobState;
use object_store::ObjectStore;

/// Uploads the shards under `local` to `url` and indexes them there with `dpctl dataset index`.
async fn indexed_in_bucket(s3: &S3Server, local: &Path, url: &str) {
    s3.upload(local, url).await;
    let o = dpctl_with_env(&["dataset", "index", "--train-tokenizer", url], &s3.env());
    assert!(o.status.success(), "dataset index {url}: {}", String::from_utf8_lossy(&o.stderr));
}

/// The object names under `url`, relative to it.
async fn listed(s3: &S3Server, url: &str) -> Vec<String> {
    use futures::TryStreamExt;
    let (store, root) = s3.store(url);
    let objects: Vec<_> = store.list(Some(&root)).try_collect().await.expect("listing the bucket");
    let prefix = format!("{root}/");
    objects.into_iter().map(|o| o.location.to_string().trim_start_matches(&prefix).to_owned()).collect()
}

/// Copies every object under `from` to `to`, as a bucket sync would: the copies get the target
/// bucket's own version ids, so the versions an index pinned are unknown there.
async fn copied(s3: &S3Server, from: &str, to: &str) {
    use object_store::ObjectStoreExt;
    let (source, source_root) = s3.store(from);
    let (target, target_root) = s3.store(to);
    for name in listed(s3, from).await {
        let from = object_store::path::Path::from(format!("{source_root}/{name}"));
        let bytes = source.get(&from).await.expect("reading an object").bytes().await.expect("its bytes");
        let to = object_store::path::Path::from(format!("{target_root}/{name}"));
        target.put(&to, bytes.into()).await.expect("copying an object");
    }
}

/// The bytes of one shard with one byte flipped in its middle: the same size, other content.
fn rewritten(shard: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(shard).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_on_s3_trains_with_data_ledger_jobs_and_checkpoints_in_buckets_and_its_spend_survives_an_accountant_restart()
 {
    let dir = tempfile_dir("s3-cluster");
    let s3 = S3Server::start(&dir);
    s3.create_bucket("dpcap", false);
    s3.create_bucket("dpcap-secrets", false);
    let local = synth_shards(&dir, 240);
    indexed_in_bucket(&s3, &local, "s3://dpcap/data/train").await;
    let cluster = Cluster {
        ledger: Some("s3://dpcap/ledger".into()),
        store: Some("s3://dpcap/jobs".into()),
        coordinator_extra: vec!["--secrets-store".into(), "s3://dpcap-secrets/jobs".into()],
        env: s3.env(),
        ..Cluster::default()
    };
    let mut services = Services::with_cluster(&dir, cluster).await;
    let _workers =
        ["w0", "w1"].map(|name| Process::worker_with_env(&services.coordinator.grpc, name, &dir, &[], &s3.env()));

    let job = submit(&services, spec(Path::new("s3://dpcap/data/train"), 4)).await;
    let done = wait_until(&services, &job.job_id, within(4), ended).await;
    assert_eq!(done.state, JobState::Succeeded as i32, "{done:#?}");

    // Every charge, the job's record and its checkpoints are objects in the bucket.
    let id = &job.job_id;
    let charges = listed(&s3, &format!("s3://dpcap/ledger/jobs/{id}/charges")).await;
    assert_eq!(charges.len(), 4, "one charge object per step: {charges:?}");
    let checkpoints = listed(&s3, &format!("s3://dpcap/jobs/jobs/{id}/checkpoints")).await;
    assert!(checkpoints.iter().any(|c| c.starts_with("4/")), "the final checkpoint is in the bucket: {checkpoints:?}");
    let secrets = listed(&s3, "s3://dpcap-secrets/jobs").await;
    assert!(!secrets.is_empty(), "the job's secrets are in their own bucket");

    // A new accountant on the same bucket reads the same spend back from the ledger.
    let before = spend(&services, id).await;
    assert_eq!(before.steps_charged, 4, "{before:?}");
    services.restart_accountant(Duration::from_millis(200)).await;
    let after = spend(&services, id).await;
    assert_eq!(
        (after.steps_charged, after.epsilon_spent, after.next_step),
        (before.steps_charged, before.epsilon_spent, before.next_step),
        "{after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_replaced_in_a_bucket_fails_its_job_by_name_unless_the_bucket_kept_the_pinned_version_and_a_copy_is_held_to_its_digests()
 {
    let dir = tempfile_dir("s3-pinning");
    let s3 = S3Server::start(&dir);
    s3.create_bucket("plain", false);
    s3.create_bucket("versioned", true);
    let local = synth_shards(&dir, 240);
    indexed_in_bucket(&s3, &local, "s3://plain/train").await;
    indexed_in_bucket(&s3, &local, "s3://versioned/train").await;
    s3.create_bucket("copy", true);
    copied(&s3, "s3://versioned/train", "s3://copy/train").await;
    // After indexing, the same shard is overwritten in both buckets (same size, other bytes).
    let replacement = rewritten(&local.join("shard-00001.tar"));
    for bucket in ["plain", "versioned"] {
        use object_store::ObjectStoreExt;
        let (store, root) = s3.store(&format!("s3://{bucket}/train"));
        let shard = object_store::path::Path::from(format!("{root}/shard-00001.tar"));
        store.put(&shard, replacement.clone().into()).await.expect("replacing the shard");
    }
    let services = Services::with_cluster(&dir, Cluster { env: s3.env(), ..Cluster::default() }).await;
    let _workers =
        ["w0", "w1"].map(|name| Process::worker_with_env(&services.coordinator.grpc, name, &dir, &[], &s3.env()));

    // Unversioned: the bucket holds only the new bytes, and the job refuses them by name.
    let plain = submit(&services, spec(Path::new("s3://plain/train"), 2)).await;
    let plain = wait_until(&services, &plain.job_id, within(2), ended).await;
    assert_eq!(plain.state, JobState::Failed as i32, "{plain:#?}");
    let failed = plain.conditions.iter().map(|c| c.message.as_str()).collect::<Vec<_>>().join("\n");
    assert!(failed.contains("shard-00001.tar") && failed.contains("digest"), "{failed}");

    // Versioned: the pinned version is still there, and every read asks for it.
    let versioned = submit(&services, spec(Path::new("s3://versioned/train"), 2)).await;
    let versioned = wait_until(&services, &versioned.job_id, within(2), ended).await;
    assert_eq!(versioned.state, JobState::Succeeded as i32, "{versioned:#?}");

    // A versioned copy in another bucket: the pinned version ids are the source bucket's, so
    // the shards are held to their digests instead, and the untouched copy trains.
    let copy = submit(&services, spec(Path::new("s3://copy/train"), 2)).await;
    let copy = wait_until(&services, &copy.job_id, within(2), ended).await;
    assert_eq!(copy.state, JobState::Succeeded as i32, "{copy:#?}");
}
