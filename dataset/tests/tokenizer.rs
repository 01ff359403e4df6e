//! Caption tokenizers: trained on the synthetic captions, saved and loaded, with the
//! captioner's conventions ([PAD] = 0, [CLS] … [SEP]).

use std::collections::HashMap;

use dpcap_dataset::synth::generate;
use dpcap_dataset::tokenizer::{CaptionTokenizer, TokenizerError};

fn captions(n: u64) -> Vec<String> {
    (0..n).map(|i| generate(5, i, 32).caption).collect()
}

#[test]
fn trained_tokenizer_round_trips_captions_and_pads_with_zero() {
    let tok = CaptionTokenizer::train(captions(500).into_iter(), 200).unwrap();
    assert!(tok.vocab_size() > 20 && tok.vocab_size() <= 200, "{}", tok.vocab_size());
    for caption in captions(20) {
        let ids = tok.encode(&caption, 16).unwrap();
        assert_eq!(ids.len(), 16);
        assert_eq!(ids[0], 1, "[CLS] first");
        let sep = ids.iter().position(|&i| i == 2).expect("[SEP] present");
        assert!(ids[sep + 1..].iter().all(|&i| i == 0), "PAD (0) after [SEP]: {ids:?}");
        assert!(ids[1..sep].iter().all(|&i| i > 3), "no special or unknown tokens inside: {ids:?}");
        assert_eq!(tok.decode(&ids[1..]).unwrap(), caption);
    }
    let short = tok.encode("a small red circle above a large blue square", 5).unwrap();
    assert_eq!((short.len(), short[0], short[4]), (5, 1, 2), "truncation keeps [CLS] and [SEP]: {short:?}");
}

#[test]
fn saved_tokenizers_load_identically_and_bad_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let tok = CaptionTokenizer::train(captions(300).into_iter(), 150).unwrap();
    let path = dir.path().join("tokenizer.json");
    tok.save(&path).unwrap();
    let loaded = CaptionTokenizer::load(&path).unwrap();
    let text = "a large green triangle left of a small yellow circle";
    assert_eq!(loaded.encode(text, 16).unwrap(), tok.encode(text, 16).unwrap());

    std::fs::write(dir.path().join("junk.json"), b"{ not json").unwrap();
    assert!(matches!(CaptionTokenizer::load(&dir.path().join("junk.json")), Err(TokenizerError::Library(_))));

    // A vocabulary whose [PAD] is not id 0 would break the captioner's loss mask.
    let vocab: HashMap<String, u32> = [("[UNK]", 0), ("[CLS]", 1), ("[SEP]", 2), ("[PAD]", 3), ("a", 4)]
        .iter()
        .map(|(t, i)| (t.to_string(), *i))
        .collect();
    let model = tokenizers::models::wordlevel::WordLevel::builder()
        .vocab(vocab.into_iter().collect())
        .unk_token("[UNK]".into())
        .build()
        .unwrap();
    let other = dir.path().join("other.json");
    tokenizers::Tokenizer::new(model).save(&other, false).unwrap();
    let err = CaptionTokenizer::load(&other).unwrap_err();
    assert!(matches!(err, TokenizerError::Special { token: "[PAD]", .. }), "{err}");
}

/// DP-Cap's tokenizer: bert-base-uncased's real vocabulary (tests/data/README.md says where it
/// comes from) gives the ids of Hugging Face's Python `tokenizers` on 64 hard captions
/// (accents, CJK, emoji, control characters, a 200-word caption), in the captioner's 40-token
/// form too.
#[test]
fn bert_base_uncased_from_its_vocab_matches_the_reference_ids() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let vocab = std::fs::read(dir.join("bert-base-uncased-vocab.txt")).unwrap();
    let tokenizer = CaptionTokenizer::from_vocab(&vocab).unwrap();
    assert_eq!((tokenizer.vocab_size(), tokenizer.bos_eos()), (30_522, (101, 102)));
    let vectors: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("bert-vectors.json")).unwrap()).unwrap();
    let cases = vectors["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 64);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<i64> = case["ids40"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        assert_eq!(tokenizer.encode(text, 40).unwrap(), want, "caption {text:?}");
    }
}
