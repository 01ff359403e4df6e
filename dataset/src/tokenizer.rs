//! Caption tokenisation with Hugging Face `tokenizers`: load a `tokenizer.json` (for example
//! bert-base-uncased's) or train a WordPiece vocabulary on the dataset's captions. Captions
//! become `[CLS] words… [SEP]` padded with `[PAD]`, which must be id 0 (the captioner's PAD).

use std::path::Path;

use tokenizers::decoders::wordpiece::WordPiece as WordPieceDecoder;
use tokenizers::models::TrainerWrapper;
use tokenizers::models::wordpiece::{WordPiece, WordPieceTrainer};
use tokenizers::normalizers::bert::BertNormalizer;
use tokenizers::pre_tokenizers::bert::BertPreTokenizer;
use tokenizers::{AddedToken, Tokenizer};

/// Special tokens, in the id order a trained vocabulary gives them (PAD = 0).
pub const SPECIALS: [&str; 4] = ["[PAD]", "[CLS]", "[SEP]", "[UNK]"];

/// Why a tokenizer could not be built, loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// The tokenizers library failed (bad file, training error).
    #[error("tokenizer: {0}")]
    Library(#[source] tokenizers::Error),
    /// A required special token is missing or misplaced.
    #[error("tokenizer special token {token}: {reason}")]
    Special {
        /// The token.
        token: &'static str,
        /// What is wrong.
        reason: String,
    },
}

fn library(e: impl Into<tokenizers::Error>) -> TokenizerError {
    TokenizerError::Library(e.into())
}

/// A tokenizer with the captioner's conventions.
#[derive(Debug, Clone)]
pub struct CaptionTokenizer {
    inner: Tokenizer,
    bos: u32,
    eos: u32,
}

impl CaptionTokenizer {
    fn wrap(inner: Tokenizer) -> Result<Self, TokenizerError> {
        let id = |token: &'static str| {
            inner.token_to_id(token).ok_or(TokenizerError::Special { token, reason: "not in the vocabulary".into() })
        };
        let pad = id("[PAD]")?;
        if pad != 0 {
            return Err(TokenizerError::Special {
                token: "[PAD]",
                reason: format!("has id {pad}, the captioner needs 0"),
            });
        }
        Ok(Self { bos: id("[CLS]")?, eos: id("[SEP]")?, inner })
    }

    /// Loads a `tokenizer.json`.
    pub fn load(path: &Path) -> Result<Self, TokenizerError> {
        Self::wrap(Tokenizer::from_file(path).map_err(library)?)
    }

    /// Parses the bytes of a `tokenizer.json` (e.g. read from an object store).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, TokenizerError> {
        Self::wrap(Tokenizer::from_bytes(bytes).map_err(library)?)
    }

    /// A BERT WordPiece tokenizer from the bytes of a `vocab.txt` (one token per line, id =
    /// line number), configured as `BertWordPieceTokenizer(vocab, lowercase=True)`:
    /// bert-base-uncased, DP-Cap's tokenizer. Special tokens in a caption's text (a literal
    /// `[SEP]`) map to their ids, as in Hugging Face's.
    pub fn from_vocab(vocab_txt: &[u8]) -> Result<Self, TokenizerError> {
        let vocab = WordPiece::read_bytes(vocab_txt).map_err(library)?;
        let model = WordPiece::builder()
            .vocab(vocab)
            .unk_token("[UNK]".into())
            .continuing_subword_prefix("##".into())
            .max_input_chars_per_word(100)
            .build()
            .map_err(library)?;
        let mut tokenizer = Tokenizer::new(model);
        let specials: Vec<AddedToken> = ["[UNK]", "[SEP]", "[CLS]", "[PAD]", "[MASK]"]
            .into_iter()
            .filter(|t| tokenizer.token_to_id(t).is_some())
            .map(|t| AddedToken::from(t, true))
            .collect();
        tokenizer.add_special_tokens(&specials);
        // clean_text, handle_chinese_chars, strip_accents (follows lowercase), lowercase.
        tokenizer.with_normalizer(Some(BertNormalizer::new(true, true, None, true)));
        tokenizer.with_pre_tokenizer(Some(BertPreTokenizer));
        tokenizer.with_decoder(Some(WordPieceDecoder::new("##".into(), true)));
        Self::wrap(tokenizer)
    }

    /// The `tokenizer.json` text.
    pub fn to_json(&self) -> Result<String, TokenizerError> {
        self.inner.to_string(false).map_err(library)
    }

    /// Trains a lower-casing WordPiece vocabulary of at most `vocab_size` on `captions`.
    pub fn train<I: Iterator<Item = String> + Send>(captions: I, vocab_size: usize) -> Result<Self, TokenizerError> {
        let model = WordPiece::builder().unk_token("[UNK]".into()).build().map_err(library)?;
        let mut tokenizer = Tokenizer::new(model);
        tokenizer.with_normalizer(Some(BertNormalizer::default()));
        tokenizer.with_pre_tokenizer(Some(BertPreTokenizer));
        tokenizer.with_decoder(Some(WordPieceDecoder::default()));
        let specials = SPECIALS.iter().map(|t| AddedToken::from(*t, true)).collect();
        let mut trainer: TrainerWrapper = WordPieceTrainer::builder()
            .vocab_size(vocab_size)
            .special_tokens(specials)
            .show_progress(false)
            .build()
            .into();
        tokenizer.train(&mut trainer, captions).map_err(library)?;
        Self::wrap(tokenizer)
    }

    /// Saves as `tokenizer.json`.
    pub fn save(&self, path: &Path) -> Result<(), TokenizerError> {
        self.inner.save(path, true).map_err(library)
    }

    /// The ids of [CLS] (begin) and [SEP] (end).
    pub fn bos_eos(&self) -> (i64, i64) {
        (i64::from(self.bos), i64::from(self.eos))
    }

    /// Vocabulary size including special tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// `[CLS] tokens… [SEP]` truncated (keeping `[SEP]`) or padded with 0 to exactly `seq` ids.
    pub fn encode(&self, caption: &str, seq: usize) -> Result<Vec<i64>, TokenizerError> {
        let encoding = self.inner.encode(caption, false).map_err(library)?;
        let body = encoding.get_ids();
        let keep = body.len().min(seq.saturating_sub(2));
        let mut ids: Vec<i64> = Vec::with_capacity(seq);
        ids.push(i64::from(self.bos));
        ids.extend(body[..keep].iter().map(|&i| i64::from(i)));
        ids.push(i64::from(self.eos));
        ids.resize(seq, 0);
        Ok(ids)
    }

    /// Text of `ids`, stopping at `[SEP]` and skipping special tokens.
    pub fn decode(&self, ids: &[i64]) -> Result<String, TokenizerError> {
        let body: Vec<u32> = ids.iter().filter_map(|&i| u32::try_from(i).ok()).take_while(|&i| i != self.eos).collect();
        self.inner.decode(&body, true).map_err(library)
    }
}
