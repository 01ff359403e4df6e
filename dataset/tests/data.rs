//! Shards → compact index → random access by range reads; img2dataset's layout with its damage
//! (missing and corrupt members skipped and counted); bad shards and tampered tables refused.

use std::sync::{Arc, Mutex};

use dpcap_dataset::index::MANIFEST_PATH;
use dpcap_dataset::indexer::REPORT_PATH;
use dpcap_dataset::pipeline::{Crop, Pipeline};
use dpcap_dataset::synth::{CLASSES, Scene, class_name, generate, write_shards};
use dpcap_dataset::{BuildOptions, DataError, ShardReader, build_index};
use futures::stream::BoxStream;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetRange, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult,
};

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

/// An object store that records every read it serves (path and range) and every HEAD, over a
/// real one.
#[derive(Debug)]
struct Recording {
    inner: LocalFileSystem,
    reads: Mutex<Vec<(String, Option<GetRange>)>>,
    heads: Mutex<Vec<String>>,
}

impl std::fmt::Display for Recording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Recording({})", self.inner)
    }
}

#[tonic::async_trait]
impl ObjectStore for Recording {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> object_store::Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> object_store::Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }
    async fn get_opts(&self, location: &Path, options: GetOptions) -> object_store::Result<GetResult> {
        if options.head {
            self.heads.lock().unwrap().push(location.to_string());
        } else {
            self.reads.lock().unwrap().push((location.to_string(), options.range.clone()));
        }
        self.inner.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: BoxStream<'static, object_store::Result<Path>>,
    ) -> BoxStream<'static, object_store::Result<Path>> {
        self.inner.delete_stream(locations)
    }
    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.inner.list(prefix)
    }
    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }
    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

fn pixels(image: &image::RgbImage) -> Vec<f32> {
    Pipeline::clip(32).unwrap().transform(image, &Crop::Eval).unwrap()
}

#[tokio::test]
async fn shards_index_compactly_and_one_range_read_fetches_just_an_example() {
    let dir = tempfile::tempdir().unwrap();
    let shards = write_shards(&dir.path().join("train"), (Scene::Pair, 3), 0..250, 100, 32).unwrap();
    assert_eq!(shards.len(), 3);
    let store = LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    let root = Path::from("train");
    let built = build_index(&store, &root, options(2), &|_| {}).await.unwrap();
    let m = &built.manifest;
    assert_eq!(m.examples, 250);
    assert_eq!(m.shards.iter().map(|s| s.examples).collect::<Vec<_>>(), vec![100, 100, 50]);
    assert_eq!(m.skipped.total(), 0);
    let table_bytes: u64 = m.shards.iter().map(|s| s.table_bytes).sum();
    assert!(table_bytes <= 16 * 250, "{table_bytes} index bytes for 250 examples");

    let recording = Arc::new(Recording { inner: store, reads: Mutex::default(), heads: Mutex::default() });
    // As on an object store, whose ETags follow the content: a HEAD pins each shard.
    let reader = ShardReader::open(recording.clone(), root.clone()).await.unwrap().trusting_content_e_tags(true);
    assert_eq!(reader.digest(), built.digest, "the manifest read back is the one written");
    for i in [0u64, 99, 100, 173, 249] {
        let got = reader.read(i).await.unwrap();
        let mut want = generate(3, i, 32);
        dpcap_dataset::synth::stamp(&mut want.image, i);
        assert_eq!((got.caption.as_str(), got.label), (want.caption.as_str(), Some(want.label)));
        let decoded = Pipeline::clip(32).unwrap().process(&got.image, &Crop::Eval).unwrap();
        assert_eq!(decoded, pixels(&want.image), "example {i}: PNG round trip is lossless");
    }
    let reads = recording.reads.lock().unwrap().clone();
    let shard_reads: Vec<_> = reads.iter().filter(|(path, _)| path.ends_with(".tar")).collect();
    assert_eq!(shard_reads.len(), 5, "one range request per example: {reads:?}");
    for (path, range) in shard_reads {
        match range {
            Some(GetRange::Bounded(r)) => assert!(r.end - r.start < 4096, "{path}: {r:?} is more than one example"),
            other => panic!("{path}: a whole-object read {other:?}"),
        }
    }
    let tables = reads.iter().filter(|(path, _)| path.contains("index/shards/")).count();
    assert_eq!(tables, 3, "each shard's table is read once and kept: {reads:?}");
    let heads = recording.heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 3, "one HEAD checks each shard's pin (size and ETag), then never again: {heads:?}");
    // A local file's ETag is metadata: without that trust each shard is hashed, once, streamed.
    recording.reads.lock().unwrap().clear();
    let hashing = ShardReader::open(recording.clone(), root.clone()).await.unwrap();
    for i in [0u64, 99, 100, 249, 1] {
        hashing.read(i).await.unwrap();
    }
    let whole: Vec<_> =
        recording.reads.lock().unwrap().iter().filter(|(p, r)| p.ends_with(".tar") && r.is_none()).cloned().collect();
    assert_eq!(whole.len(), 3, "each shard read whole once: {whole:?}");
    let err = reader.read(250).await.unwrap_err();
    assert!(matches!(err, DataError::OutOfRange { index: 250, examples: 250 }), "{err}");
}

/// img2dataset's output as it comes: .jpg/.webp/.png images, .txt captions, .json metadata,
/// a .parquet beside each tar; plus the damage a real crawl has.
#[tokio::test]
async fn missing_and_corrupt_members_are_skipped_counted_and_reported_and_never_reach_a_job() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("laion");
    std::fs::create_dir_all(&root).unwrap();
    let png = |seed: u64| {
        let mut bytes = Vec::new();
        generate(1, seed, 32).image.write_to(&mut std::io::Cursor::new(&mut bytes), image::ImageFormat::Png).unwrap();
        bytes
    };
    let jpeg = {
        let mut bytes = Vec::new();
        let image = image::RgbImage::from_fn(50, 40, |x, y| image::Rgb([x as u8 * 5, y as u8 * 6, 90]));
        image.write_to(&mut std::io::Cursor::new(&mut bytes), image::ImageFormat::Jpeg).unwrap();
        bytes
    };
    let webp = {
        let mut bytes = Vec::new();
        let image = image::RgbImage::from_fn(20, 30, |x, y| image::Rgb([x as u8 * 9, 40, y as u8 * 7]));
        image.write_to(&mut std::io::Cursor::new(&mut bytes), image::ImageFormat::WebP).unwrap();
        bytes
    };
    let members: Vec<(&str, Vec<u8>)> = vec![
        ("000000000.jpg", jpeg.clone()),
        ("000000000.txt", b"a photo of a cat".to_vec()),
        ("000000000.json", br#"{"url": "http://x", "key": "000000000"}"#.to_vec()),
        ("000000001.webp", webp),
        ("000000001.txt", b"a webp image".to_vec()),
        ("000000002.png", png(2)),
        ("000000002.json", b"{}".to_vec()), // no caption
        ("000000003.txt", b"a caption without an image".to_vec()),
        ("000000004.jpg", b"\xff\xd8 truncated garbage".to_vec()),
        ("000000004.txt", b"corrupt image".to_vec()),
        ("000000005.png", png(5)),
        ("000000005.txt", vec![0xff, 0xfe, 0x00]), // not UTF-8
        ("000000006.png", png(6)),
        ("000000006.txt", b"   ".to_vec()), // empty caption
        ("000000007.PNG", png(7)),
        ("000000007.TXT", b"upper-case extensions".to_vec()),
    ];
    let mut builder = tar::Builder::new(std::fs::File::create(root.join("00000.tar")).unwrap());
    for (name, bytes) in &members {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, bytes.as_slice()).unwrap();
    }
    builder.finish().unwrap();
    std::fs::write(root.join("00000.parquet"), b"PAR1 not read").unwrap();
    std::fs::write(root.join("00000_stats.json"), b"{}").unwrap();

    let store = Arc::new(LocalFileSystem::new_with_prefix(&root).unwrap());
    let built = build_index(store.as_ref(), &Path::default(), options(1), &|_| {}).await.unwrap();
    let m = &built.manifest;
    assert_eq!(m.examples, 3, "N counts only the usable examples: jpg, webp and upper-case png");
    let s = &m.skipped;
    assert_eq!((s.missing_image, s.missing_caption, s.corrupt_image, s.corrupt_caption), (1, 1, 1, 2));
    let mut reasons: Vec<_> = built.report.iter().map(|r| (r.key.as_str(), r.reason)).collect();
    reasons.sort();
    assert_eq!(
        reasons,
        [
            ("000000002", "missing_caption"),
            ("000000003", "missing_image"),
            ("000000004", "corrupt_image"),
            ("000000005", "corrupt_caption"),
            ("000000006", "corrupt_caption")
        ]
    );
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(root.join(REPORT_PATH)).unwrap()).unwrap();
    assert_eq!(report["examples"].as_array().unwrap().len(), 5);

    let reader = ShardReader::open(store, Path::default()).await.unwrap();
    let captions: Vec<String> = futures::future::join_all((0..3).map(|i| reader.read(i)))
        .await
        .into_iter()
        .map(|e| e.unwrap().caption)
        .collect();
    assert_eq!(captions, ["a photo of a cat", "a webp image", "upper-case extensions"]);
    let pipeline = Pipeline::clip(32).unwrap();
    for i in 0..3 {
        let image = reader.read(i).await.unwrap().image;
        assert_eq!(pipeline.process(&image, &Crop::Eval).unwrap().len(), 3 * 32 * 32, "example {i} decodes");
    }
}

#[tokio::test]
async fn a_broken_tar_or_an_empty_directory_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = LocalFileSystem::new_with_prefix(dir.path()).unwrap();
    let err = build_index(&store, &Path::from("nothing"), options(1), &|_| {}).await.unwrap_err();
    assert!(matches!(err, DataError::Empty(_)), "{err}");
    std::fs::create_dir_all(dir.path().join("broken")).unwrap();
    std::fs::write(dir.path().join("broken/shard-00000.tar"), vec![0x55u8; 1500]).unwrap();
    let strict = BuildOptions { concurrency: 1, strict: true };
    let err = build_index(&store, &Path::from("broken"), strict, &|_| {}).await.unwrap_err();
    assert!(matches!(err, DataError::Tar { ref shard, .. } if shard == "shard-00000.tar"), "{err}");
    assert!(!dir.path().join("broken").join(MANIFEST_PATH).exists(), "no manifest: no job can pin a partial index");
}

#[tokio::test]
async fn a_tampered_shard_table_is_refused_against_the_manifest_digest() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(&dir.path().join("train"), (Scene::Pair, 3), 0..20, 10, 32).unwrap();
    let root = dir.path().join("train");
    let store = Arc::new(LocalFileSystem::new_with_prefix(&root).unwrap());
    build_index(store.as_ref(), &Path::default(), options(1), &|_| {}).await.unwrap();
    let table = root.join(dpcap_dataset::index::table_path(1));
    let mut bytes = std::fs::read(&table).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&table, bytes).unwrap();
    let reader = ShardReader::open(store, Path::default()).await.unwrap();
    reader.read(3).await.expect("shard 0 is intact");
    let err = reader.read(13).await.unwrap_err();
    assert!(matches!(err, DataError::Index(dpcap_dataset::index::IndexError::Digest { shard: 1, .. })), "{err}");
}

/// An indexed synthetic dataset of two shards of 10 examples under `dir/train`, and a reader.
async fn indexed(dir: &std::path::Path) -> (std::path::PathBuf, Arc<LocalFileSystem>) {
    let root = dir.join("train");
    write_shards(&root, (Scene::Pair, 3), 0..20, 10, 32).unwrap();
    let store = Arc::new(LocalFileSystem::new_with_prefix(&root).unwrap());
    build_index(store.as_ref(), &Path::default(), options(1), &|_| {}).await.unwrap();
    (root, store)
}

fn shard_file(root: &std::path::Path, n: usize) -> std::path::PathBuf {
    let mut tars: Vec<_> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "tar"))
        .collect();
    tars.sort();
    tars[n].clone()
}

#[tokio::test]
async fn a_shard_replaced_after_indexing_by_other_bytes_of_the_same_size_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (root, store) = indexed(dir.path()).await;
    let shard = shard_file(&root, 0);
    // Other bytes, the same size and still a valid tar: one byte of an image body flipped.
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[5000] ^= 0xff;
    std::fs::remove_file(&shard).unwrap();
    std::fs::write(&shard, &bytes).unwrap();
    let reader = ShardReader::open(store, Path::default()).await.unwrap();
    reader.read(13).await.expect("shard 1 is untouched");
    let err = reader.read(3).await.unwrap_err();
    let name = shard.file_name().unwrap().to_string_lossy().into_owned();
    assert!(matches!(err, DataError::Changed { ref shard, .. } if *shard == name), "{err}");
    assert!(err.to_string().contains("digest"), "{err}");
}

#[tokio::test]
async fn a_shard_rewritten_in_place_with_its_size_and_time_kept_is_still_refused_on_a_local_store() {
    let dir = tempfile::tempdir().unwrap();
    let (root, store) = indexed(dir.path()).await;
    let shard = shard_file(&root, 0);
    let modified = std::fs::metadata(&shard).unwrap().modified().unwrap();
    // The same inode, size and mtime: only the bytes differ, so the local ETag is unchanged.
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[5000] ^= 0xff;
    let file = std::fs::OpenOptions::new().write(true).open(&shard).unwrap();
    std::io::Write::write_all(&mut &file, &bytes).unwrap();
    file.set_modified(modified).unwrap();
    drop(file);
    let reader = ShardReader::open(store, Path::default()).await.unwrap();
    let err = reader.read(3).await.unwrap_err();
    assert!(err.to_string().contains("digest"), "{err}");
}

#[tokio::test]
async fn a_truncated_shard_is_refused_by_its_size_and_one_changed_mid_job_by_its_etag() {
    let dir = tempfile::tempdir().unwrap();
    let (root, store) = indexed(dir.path()).await;
    let reader = ShardReader::open(store.clone(), Path::default()).await.unwrap();
    reader.read(0).await.expect("checked and pinned at the first read");
    // Rewritten while a job reads it: the pinned ETag no longer matches.
    let shard = shard_file(&root, 0);
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::remove_file(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() - 700]).unwrap();
    let err = reader.read(1).await.unwrap_err();
    assert!(matches!(err, DataError::Changed { .. }), "{err}");
    let fresh = ShardReader::open(store, Path::default()).await.unwrap();
    let err = fresh.read(1).await.unwrap_err();
    assert!(
        matches!(err, DataError::Changed { ref reason, .. } if reason.contains("bytes, the index pinned")),
        "{err}"
    );
}

#[tokio::test]
async fn a_copy_of_the_dataset_elsewhere_reads_by_its_pinned_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (root, _) = indexed(dir.path()).await;
    // Copied: every file has a new inode and time, so every ETag differs; the bytes do not.
    let copy = dir.path().join("copy");
    copy_dir(&root, &copy);
    let store = Arc::new(LocalFileSystem::new_with_prefix(&copy).unwrap());
    let reader = ShardReader::open(store, Path::default()).await.unwrap();
    for i in [0, 15] {
        reader.read(i).await.unwrap_or_else(|e| panic!("example {i}: {e}"));
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() { copy_dir(&path, &target) } else { std::fs::copy(&path, &target).map(drop).unwrap() }
    }
}

#[tokio::test]
async fn an_empty_file_and_a_file_that_is_no_tar_are_left_out_and_reported_or_refused_under_strict() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("train");
    write_shards(&root, (Scene::Pair, 3), 0..20, 10, 32).unwrap();
    std::fs::write(root.join("zz-empty.tar"), b"").unwrap();
    std::fs::write(root.join("zz-text.tar"), vec![b'x'; 3000]).unwrap();
    let store = LocalFileSystem::new_with_prefix(&root).unwrap();
    let built = build_index(&store, &Path::default(), options(2), &|_| {}).await.unwrap();
    assert_eq!((built.manifest.shards.len(), built.manifest.examples), (2, 20), "the good shards only");
    let bad: Vec<&str> = built.bad_shards.iter().map(|b| b.path.as_str()).collect();
    assert_eq!(bad, ["zz-empty.tar", "zz-text.tar"]);
    let report = std::fs::read_to_string(root.join(REPORT_PATH)).unwrap();
    assert!(report.contains("zz-text.tar") && report.contains("an empty file"), "{report}");
    // A copy of a shard under another name is left out: its examples would be in twice.
    std::fs::remove_file(root.join("zz-empty.tar")).unwrap();
    std::fs::remove_file(root.join("zz-text.tar")).unwrap();
    let first = shard_file(&root, 0);
    std::fs::copy(&first, root.join("zz-copy.tar")).unwrap();
    let built = build_index(&store, &Path::default(), options(2), &|_| {}).await.unwrap();
    assert_eq!(built.manifest.examples, 20, "the copy adds no example");
    let copy = built.bad_shards.iter().find(|b| b.path == "zz-copy.tar").expect("the copy is reported");
    assert!(copy.reason.starts_with("the same bytes as "), "{copy:?}");
    std::fs::remove_file(root.join("zz-copy.tar")).unwrap();
    std::fs::write(root.join("zz-empty.tar"), b"").unwrap();
    let strict = BuildOptions { concurrency: 2, strict: true };
    let err = build_index(&store, &Path::default(), strict, &|_| {}).await.unwrap_err();
    assert!(matches!(err, DataError::Tar { ref shard, .. } if shard == "zz-empty.tar"), "{err}");
}

fn options(concurrency: usize) -> BuildOptions {
    BuildOptions { concurrency, strict: false }
}
