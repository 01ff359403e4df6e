//! A rank's share streams one micro-batch at a time from a pinned dataset: memory is bounded
//! by the prefetch, not the share, and a dataset other than the planned one is refused.

use dpcap_dataset::JobDataError;
use dpcap_dataset::build_index;
use dpcap_dataset::reader::{Dataset, View};
use dpcap_dataset::stream::ExampleStream;
use dpcap_dataset::synth::{Scene, write_shards};
use object_store::local::LocalFileSystem;
use object_store::path::Path;

/// A synthetic dataset, indexed; returns its URL and the manifest's digest.
async fn dataset(dir: &std::path::Path, examples: u64) -> (String, String) {
    let root = dir.join("train");
    write_shards(&root, (Scene::Pair, 3), 0..examples, 50, 32).unwrap();
    let store = LocalFileSystem::new_with_prefix(&root).unwrap();
    let built =
        build_index(&store, &Path::default(), dpcap_dataset::BuildOptions { concurrency: 2, strict: false }, &|_| {})
            .await
            .unwrap();
    (root.to_string_lossy().into_owned(), built.digest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_streams_in_micro_batches_and_never_reads_more_than_the_prefetch_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _) = dataset(dir.path(), 300).await;
    let data = Dataset::open(&url).await.unwrap();
    let (micro, prefetch) = (8, 2);
    let mut stream = ExampleStream::start(data, ((0..300).rev().collect(), View::eval(32).unwrap()), micro, prefetch);
    // A consumer that has not started: the reader stops once `prefetch` chunks wait decoded.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(stream.examples_read() <= micro * prefetch, "read {} ahead of the consumer", stream.examples_read());
    let mut keys = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.unwrap();
        assert!(!chunk.is_empty() && chunk.len() <= micro, "chunk of {}", chunk.len());
        keys.extend(chunk.into_iter().map(|e| e.key));
        assert!(stream.examples_read() <= keys.len() + micro * (prefetch + 1));
    }
    assert_eq!(keys.len(), 300, "every example of the share, once");
    let mut unique = keys.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dataset_other_than_the_pinned_one_is_refused_and_positions_are_bounds_checked() {
    let dir = tempfile::tempdir().unwrap();
    let (url, pinned) = dataset(dir.path(), 120).await;
    let data = Dataset::open(&url).await.unwrap();
    data.check_pinned(&pinned, 120).expect("the planned index");
    let err = data.check_pinned("sha256:00", 120).unwrap_err();
    assert!(matches!(err, JobDataError::Spec { field: "dataset", .. }), "{err}");
    assert!(err.to_string().contains("digest"), "{err}");
    let err = data.check_pinned(&pinned, 121).unwrap_err();
    assert!(err.to_string().contains("121"), "{err}");
    assert_eq!(data.global(1, 49).unwrap(), 99);
    assert!(data.global(1, 50).is_err(), "position 50 of a 50-example shard");
    assert!(data.global(9, 0).is_err(), "no shard 9");
}

/// A retried step (any rank, any attempt) sees the same training crops: they are keyed by the
/// job's augmentation key, the step and the example, never by who reads them or when.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn training_crops_are_the_same_for_a_retried_step_and_differ_between_steps() {
    use dpcap_dataset::pipeline::Pipeline;
    use dpcap_dataset::reader::CropPlan;
    let dir = tempfile::tempdir().unwrap();
    let (url, _) = dataset(dir.path(), 60).await;
    let data = Dataset::open(&url).await.unwrap();
    let pipeline = std::sync::Arc::new(Pipeline::clip(32).unwrap());
    let view = |step| View { pipeline: pipeline.clone(), crop: CropPlan::Train { key: [3; 32], step } };
    let indices = vec![5, 17, 42];
    let first = data.read(indices.clone(), &view(7)).await.unwrap();
    let retried = Dataset::open(&url).await.unwrap().read(indices.clone(), &view(7)).await.unwrap();
    let next = data.read(indices, &view(8)).await.unwrap();
    for ((a, b), c) in first.iter().zip(&retried).zip(&next) {
        assert_eq!(a.pixels, b.pixels, "{}: the same pixels on a retry", a.key);
        assert_ne!(a.pixels, c.pixels, "{}: another step, another crop", a.key);
    }
}
