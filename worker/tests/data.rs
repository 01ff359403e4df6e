//! Synthetic shards → index → random access by range reads, and bad shards refused with the
//! reason.

use std::sync::Arc;

use dpcap_worker::data::synth::{CLASSES, Scene, class_name, generate, write_shards};
use dpcap_worker::data::{DataError, build_index, read_example};
use object_store::local::LocalFileSystem;
use object_store::path::Path;

#[test]
fn examples_are_deterministic_and_captions_describe_the_label() {
    let a = generate(7, 42, 32);
    assert_eq!(a, generate(7, 42, 32));
    assert_ne!(a.image, generate(7, 43, 32).image);
    assert_ne!(a.image, generate(8, 42, 32).image);
    for i in 0..200 {
        let e = generate(1, i, 32);
        assert!((e.label as usize) < CLASSES);
        assert!(
            e.caption.starts_with(&format!("a small {}", class_name(e.label)))
                || e.caption.starts_with(&format!("a large {}", class_name(e.label))),
            "{}",
            e.caption
        );
        assert!(e.caption.contains(" above a ") || e.caption.contains(" left of a "), "{}", e.caption);
    }
    let labels: std::collections::BTreeSet<u32> = (0..300).map(|i| generate(1, i, 32).label).collect();
    assert_eq!(labels.len(), CLASSES, "every class occurs");
}

#[tokio::test]
async fn shards_index_and_range_reads_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let shards = write_shards(&dir.path().join("train"), (Scene::Pair, 3), 0..250, 100, 32).unwrap();
    assert_eq!(shards.len(), 3);
    let store = Arc::new(LocalFileSystem::new_with_prefix(dir.path()).unwrap());
    let root = Path::from("train");
    let index = build_index(store.as_ref(), &root).await.unwrap();
    assert_eq!(index.examples, 250);
    assert_eq!(index.shards.iter().map(|s| s.examples.len()).collect::<Vec<_>>(), vec![100, 100, 50]);
    for i in [0u64, 99, 100, 173, 249] {
        let got = read_example(store.as_ref(), &root, &index, i).await.unwrap();
        let want = generate(3, i, 32);
        assert_eq!(
            (got.key.as_str(), got.caption.as_str(), got.label),
            (want.key.as_str(), want.caption.as_str(), Some(want.label))
        );
        assert_eq!(got.image, want.image, "example {i}: PNG round trip is lossless");
    }
    let err = read_example(store.as_ref(), &root, &index, 250).await.unwrap_err();
    assert!(matches!(err, DataError::OutOfRange { index: 250, examples: 250 }), "{err}");
}

#[tokio::test]
async fn bad_shards_are_refused_naming_the_shard_or_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    assert!(matches!(build_index(&store, &Path::from("nothing")).await.unwrap_err(), DataError::Empty(_)));

    std::fs::create_dir_all(dir.path().join("broken")).unwrap();
    std::fs::write(dir.path().join("broken/shard-00000.tar"), vec![0x55u8; 1500]).unwrap();
    let err = build_index(&store, &Path::from("broken")).await.unwrap_err();
    assert!(matches!(err, DataError::Tar { ref shard, .. } if shard == "shard-00000.tar"), "{err}");

    // A shard whose example has an image but no caption.
    std::fs::create_dir_all(dir.path().join("partial")).unwrap();
    let file = std::fs::File::create(dir.path().join("partial/shard-00000.tar")).unwrap();
    let mut builder = tar::Builder::new(file);
    let mut header = tar::Header::new_gnu();
    header.set_size(3);
    header.set_cksum();
    builder.append_data(&mut header, "k1.png", &b"png"[..]).unwrap();
    builder.finish().unwrap();
    let err = build_index(&store, &Path::from("partial")).await.unwrap_err();
    assert!(matches!(err, DataError::MissingMember { ref key, member: "caption", .. } if key == "k1"), "{err}");
}
