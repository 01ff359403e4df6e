//! The index format's tests: round trips, size, and hostile input.

use super::table::{put_varint, zigzag};
use super::*;

fn rng(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Lays out `n` examples as a tar would (512-byte header, data padded to 512), members in `order`.
fn tar_table(n: usize, order: [usize; 3], seed: u64) -> ShardTable {
    let (mut s, mut pos) = (seed, 0u64);
    let entries = (0..n)
        .map(|_| {
            let lens = [5_000 + rng(&mut s) % 55_000, 20 + rng(&mut s) % 180, 300 + rng(&mut s) % 600];
            let mut spans = [Span { offset: 0, len: 0 }; 3];
            for m in order {
                spans[m] = Span { offset: pos + 512, len: lens[m] };
                pos += 512 + lens[m].div_ceil(512) * 512;
            }
            TableEntry { image_kind: ImageKind::Jpeg, image: spans[0], caption: spans[1], meta: Some(spans[2]) }
        })
        .collect();
    ShardTable { entries }
}

fn small_table() -> ShardTable {
    let span = |offset, len| Span { offset, len };
    let entries = vec![
        TableEntry { image_kind: ImageKind::Jpeg, image: span(512, 9000), caption: span(10240, 40), meta: None },
        TableEntry {
            image_kind: ImageKind::Png,
            image: span(12800, 7),
            caption: span(11264, 0),
            meta: Some(span(1, 2)),
        },
        TableEntry {
            image_kind: ImageKind::Webp,
            image: span(i64::MAX as u64 - 9, 9),
            caption: span(0, 0),
            meta: None,
        },
    ];
    ShardTable { entries }
}

fn format_error(bytes: &[u8]) -> String {
    match ShardTable::decode(bytes) {
        Err(IndexError::Format { reason }) => reason,
        other => panic!("expected a format error, got {other:?}"),
    }
}

#[test]
fn a_table_round_trips_and_stays_under_16_bytes_per_example() {
    for (order, seed) in [([0, 1, 2], 7), ([0, 2, 1], 11), ([1, 0, 2], 13)] {
        let table = tar_table(10_000, order, seed);
        let bytes = table.encode();
        eprintln!("order {order:?}: {:.2} bytes/example", bytes.len() as f64 / 10_000.0);
        assert!(bytes.len() <= 16 * 10_000, "{} bytes for order {order:?}", bytes.len());
        assert_eq!(ShardTable::decode(&bytes).unwrap(), table);
    }
}

#[test]
fn every_kind_with_and_without_meta_and_members_in_any_order_round_trips() {
    let table = small_table();
    assert_eq!(ShardTable::decode(&table.encode()).unwrap(), table);
    assert_eq!(ShardTable::decode(&ShardTable::default().encode()).unwrap(), ShardTable::default());
}

#[test]
fn every_truncation_of_a_valid_table_is_an_error() {
    let bytes = small_table().encode();
    for end in 0..bytes.len() {
        assert!(ShardTable::decode(&bytes[..end]).is_err(), "prefix of {end} bytes decoded");
    }
}

#[test]
fn random_garbage_and_mutated_tables_never_panic() {
    let (mut s, valid) = (0x9e37_79b9_7f4a_7c15u64, tar_table(20, [0, 1, 2], 3).encode());
    for i in 0..6000 {
        let mut bytes: Vec<u8> = match i % 3 {
            0 => Vec::new(),
            1 => b"DPIX\x01".to_vec(),
            _ => valid.clone(),
        };
        if i % 3 == 2 {
            for _ in 0..1 + rng(&mut s) % 3 {
                let at = (rng(&mut s) % bytes.len() as u64) as usize;
                bytes[at] = rng(&mut s) as u8;
            }
        } else {
            bytes.extend((0..rng(&mut s) % 80).map(|_| rng(&mut s) as u8));
        }
        let _ = ShardTable::decode(&bytes);
    }
}

#[test]
fn a_huge_claimed_count_in_a_short_input_is_rejected_before_allocating() {
    let mut bytes = b"DPIX\x01".to_vec();
    put_varint(&mut bytes, u64::MAX);
    bytes.extend([0; 20]);
    assert!(format_error(&bytes).contains(&format!("count {}", u64::MAX)));
}

#[test]
fn malformed_tables_are_rejected_with_the_reason() {
    let good = small_table().encode();
    let with = |at: usize, byte: u8| [&good[..at], &[byte], &good[at + 1..]].concat();
    assert_eq!(format_error(b"DPIY\x01\x00"), "bad magic");
    assert_eq!(format_error(&with(4, 2)), "unknown version 2");
    assert!(format_error(&with(6, 0x08)).starts_with("reserved flag bits in 0x08"));
    assert!(format_error(&with(6, 3)).starts_with("unknown image kind 3"));
    assert!(format_error(&[&good[..], &[0]].concat()).starts_with("1 trailing bytes"));
    assert!(format_error(b"DPIX\x01\x01\x00\x01\x00\x00\x00").starts_with("offset 0-1 out of range"));
    assert!(format_error(&[b"DPIX\x01".as_slice(), &[0xff; 10], &[1]].concat()).starts_with("varint overflow"));
    let mut end_overflow = b"DPIX\x01\x01\x00".to_vec();
    put_varint(&mut end_overflow, zigzag(i64::MAX));
    put_varint(&mut end_overflow, u64::MAX);
    assert!(format_error(&[&end_overflow[..], &[0, 0]].concat()).contains("overflows"));
}

fn manifest() -> (Manifest, Vec<Vec<u8>>) {
    let tables = [tar_table(3, [0, 1, 2], 1), ShardTable::default(), tar_table(2, [0, 1, 2], 2)].map(|t| t.encode());
    let shards = tables
        .iter()
        .enumerate()
        .map(|(i, t)| ShardRecord {
            path: format!("{i:05}.tar"),
            examples: [3, 0, 2][i],
            skipped: 1,
            table_bytes: t.len() as u64,
            table_sha256: dpcap_proto::digest::sha256(t),
            bytes: 10_240 * (i as u64 + 1),
            sha256: dpcap_proto::digest::sha256(format!("shard {i}").as_bytes()),
            ..Default::default()
        })
        .collect();
    let skipped = Skipped { missing_image: 1, missing_caption: 1, corrupt_image: 0, corrupt_caption: 1, duplicate: 0 };
    let example_ids = Some(ExampleIdsRecord { bytes: 13 + 5 * 8, sha256: dpcap_proto::digest::sha256(b"ids") });
    (Manifest { version: MANIFEST_VERSION, examples: 5, shards, skipped, users: None, example_ids }, tables.to_vec())
}

fn rejected_field(m: &Manifest) -> &'static str {
    match Manifest::parse(&serde_json::to_vec(m).unwrap()) {
        Err(IndexError::Field { field, .. }) => field,
        other => panic!("expected a field error, got {other:?}"),
    }
}

#[test]
fn manifest_parse_rejects_wrong_totals_bad_digests_escaping_paths_and_version_1() {
    let (good, _) = manifest();
    assert_eq!(Manifest::parse(&serde_json::to_vec(&good).unwrap()).unwrap(), good);
    let broken = |edit: fn(&mut Manifest)| {
        let mut m = good.clone();
        edit(&mut m);
        rejected_field(&m)
    };
    assert_eq!(broken(|m| m.version = 1), "version");
    assert_eq!(broken(|m| m.examples = 6), "examples");
    assert_eq!(broken(|m| m.shards[1].examples = u64::MAX), "examples");
    assert_eq!(broken(|m| m.skipped.corrupt_image = 1), "skipped");
    assert_eq!(broken(|m| m.shards[0].table_sha256 = format!("sha256:{}", "A".repeat(64))), "table_sha256");
    assert_eq!(broken(|m| m.shards[0].table_sha256 = m.shards[0].table_sha256[7..].to_string()), "table_sha256");
    for path in
        ["", "/data/0.tar", "../0.tar", "a/../../0.tar", "a\\0.tar", "00001.tar", "a//0.tar", "a/0.tar/", "./0.tar"]
    {
        let mut m = good.clone();
        m.shards[0].path = path.into();
        assert_eq!(rejected_field(&m), "path", "{path:?}");
    }
    assert!(matches!(Manifest::parse(b"{"), Err(IndexError::Json(_))));
    // Version 3 pins every shard's bytes, each shard's its own; version 2 pinned none.
    assert_eq!(broken(|m| m.shards[1].sha256 = String::new()), "sha256");
    assert_eq!(broken(|m| m.shards[1].bytes = 0), "sha256");
    assert_eq!(broken(|m| m.shards[2].sha256 = m.shards[0].sha256.clone()), "sha256");
    // Version 4 pins the example identities, N of them.
    assert_eq!(broken(|m| m.example_ids = None), "example_ids");
    assert_eq!(broken(|m| m.example_ids.as_mut().unwrap().bytes = 13 + 4 * 8), "example_ids");
    let mut v3 = good.clone();
    (v3.version, v3.example_ids) = (3, None);
    let v3 = Manifest::parse(&serde_json::to_vec(&v3).unwrap()).expect("a version-3 index still loads");
    assert_eq!(v3.data_digest(), v3.shards_digest(), "named by its shards' bytes, as it was");
    assert_eq!(good.data_digest().as_deref(), Some(dpcap_proto::digest::sha256(b"ids").as_str()), "by its examples");
    let mut v2 = good.clone();
    v2.example_ids = None;
    v2.version = 2;
    v2.shards.iter_mut().for_each(|s| (s.bytes, s.sha256) = (0, String::new()));
    assert!(Manifest::parse(&serde_json::to_vec(&v2).unwrap()).is_ok(), "a version-2 index still loads");
    assert_eq!(Manifest::digest(b""), dpcap_proto::digest::sha256(b""));
}

#[test]
fn check_table_accepts_the_pinned_table_and_rejects_a_flipped_byte_and_a_wrong_length() {
    let (m, tables) = manifest();
    assert_eq!(m.check_table(0, &tables[0]).unwrap().entries.len(), 3);
    let mut flipped = tables[2].clone();
    flipped[7] ^= 1;
    assert!(matches!(m.check_table(2, &flipped), Err(IndexError::Digest { shard: 2, .. })));
    let err = m.check_table(0, &tables[0][1..]).unwrap_err();
    assert!(matches!(err, IndexError::Count { shard: 0, what: "table bytes", .. }), "{err}");
    assert!(m.check_table(3, &tables[0]).is_err());
    let mut lying = m.clone();
    lying.shards[1].examples = 1;
    assert!(matches!(lying.check_table(1, &tables[1]), Err(IndexError::Count { what: "examples", .. })));
}

#[test]
fn layout_locate_and_global_agree_for_every_example_and_skip_empty_shards() {
    let layout = Layout::from_counts(&[3, 0, 0, 2, 5, 0]);
    assert_eq!((layout.examples(), layout.shards()), (10, 6));
    for g in 0..10 {
        let (shard, local) = layout.locate(g).unwrap();
        assert!(layout.count(shard).unwrap() > 0, "example {g} in empty shard {shard}");
        assert_eq!(layout.global(shard, local), Some(g));
    }
    assert_eq!(layout.locate(3), Some((3, 0)));
    assert_eq!((layout.locate(10), layout.global(1, 0), layout.global(4, 5)), (None, None, None));
    assert_eq!((layout.count(6), layout.start(6), layout.start(4)), (None, None, Some(5)));
    assert_eq!(Layout::from_counts(&[0, 0]).locate(0), None);
    assert_eq!(manifest().0.layout().locate(3), Some((2, 0)));
}

#[test]
fn image_kinds_and_table_paths_are_spelled_as_the_indexer_writes_them() {
    assert_eq!(ImageKind::from_ext("JPEG").map(|k| k.ext()), Some("jpg"));
    assert_eq!(
        (ImageKind::from_ext("Png"), ImageKind::from_ext("webp")),
        (Some(ImageKind::Png), Some(ImageKind::Webp))
    );
    assert_eq!(ImageKind::from_ext("txt"), None);
    assert_eq!(table_path(7), "index/shards/000007.bin");
}
