#!/usr/bin/env python3
"""Reference token ids for bert-base-uncased, made with the Python `tokenizers` package.

Usage: python3 make_vectors.py VOCAB_TXT OUT_JSON

Builds BertWordPieceTokenizer(vocab, lowercase=True) -- BertNormalizer(clean_text=True,
handle_chinese_chars=True, strip_accents=None (follows lowercase), lowercase=True),
BertPreTokenizer, WordPiece(unk "[UNK]", max_input_chars_per_word 100, prefix "##") -- and
encodes the captions below without special tokens ("ids") and in the 40-token form that
worker's CaptionTokenizer::encode(caption, 40) produces ("ids40": [CLS] + first 38 body ids
+ [SEP], padded with [PAD]=0).

Written JSON: {"tokenizers_version", "vocab_sha256", "seq", "cases": [{"text", "ids", "ids40"}]}.
Made with tokenizers==0.22.2 (the Python release paired with the Rust crate 0.22.2).
"""

import hashlib
import json
import sys

import tokenizers
from tokenizers import BertWordPieceTokenizer

SEQ = 40

LONG_WORD = "a" * 101  # over max_input_chars_per_word (100) -> [UNK]
WORD_100 = "b" * 100  # exactly 100 chars: still split into pieces

LONG_CAPTION = " ".join(
    (
        "a photograph of a small red house standing alone on a green hill under a cloudy "
        "sky with mountains in the distance and a dirt road leading up to the front door"
    ).split()
    * 7
)[: 10_000]
LONG_CAPTION = " ".join(LONG_CAPTION.split()[:200])

CAPTIONS = [
    # plain LAION / COCO-style captions
    "A man riding a wave on top of a surfboard.",
    "a dog sitting on a couch next to a cat",
    "Two plates of food on a wooden table with forks and knives.",
    "Stock photo: Young woman drinking coffee in a cafe, smiling",
    "Vintage 1960s Ford Mustang Convertible for sale | Classic Cars",
    "Men's Slim Fit Cotton T-Shirt - Navy Blue (Size XL)",
    "Aerial view of the city skyline at sunset, New York",
    "Watercolor painting of a fox in a snowy forest",
    "unbelievable transformational hyperrealistic photogrammetry",
    "the quick brown fox jumps over the lazy dog",
    # case
    "A BLACK AND WHITE PHOTO OF AN OLD TRAIN STATION",
    "CamelCase iPhone McDonald's eBay YouTube",
    # accents / diacritics
    "café",
    "naïve résumé at the Café de Flore",
    "Ångström unit measurement",
    "São Paulo, Zürich, Kraków, Reykjavík",
    "crème brûlée façade coöperate",
    "Ölçek ŞİŞLİ İstanbul",  # Turkish dotted/dotless i
    "Straße groß",  # German sharp s
    "Ǆemal ǅ ǆ ﬁnance ﬂower",  # digraph and ligature compatibility chars
    "e\u0301 combining acute; n\u0303 combining tilde",
    # punctuation runs
    "Wow!!! Really??? ...yes... --- ok;;; (((nested))) [[brackets]]",
    "\"quoted\" 'single' `back` «guillemets» „low“ — em dash – en dash",
    "price: $19.99!!! 50% off*** #sale @store & more ~~~ ^^^ |||",
    "well...",
    "a/b\\c_d-e+f=g<h>i{j}k",
    # URLs / emails / paths
    "https://www.example.com/images/photo_123.jpg?size=large&v=2",
    "Visit http://laion.ai or email info@example.org for details",
    "C:\\Users\\photos\\IMG_0001.JPG",
    # numbers
    "3.14159 and 2,718.28 and 1e-10 and -42",
    "1920x1080 HD wallpaper 4K 60fps",
    "Room 101, 2nd floor, 10:30am on 2023-05-17",
    "½ cup sugar, ¾ tsp salt, x² + y³, ①②③",
    # emoji / symbols
    "I love pizza 🍕🍕🍕 so much ❤️",
    "👨‍👩‍👧‍👦 family emoji with ZWJ",
    "Thumbs up 👍🏽 and flags 🇺🇸🇯🇵",
    "© 2020 Getty Images ™ ® ℃ € £ ¥",
    # CJK / other scripts
    "東京タワーの夜景",
    "北京 天安门 广场",
    "한국어 캡션 테스트",
    "a photo of 猫 on a mat",
    "Москва зимой — красная площадь",
    "Η Ακρόπολη της Αθήνας",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "ภาษาไทย ไม่มีช่องว่าง",
    "Ｆｕｌｌｗｉｄｔｈ　ｃｈａｒｓ　１２３",
    # long words
    LONG_WORD,
    WORD_100,
    "prefix " + LONG_WORD + " suffix",
    "pneumonoultramicroscopicsilicovolcanoconiosis",
    # whitespace / control characters
    "tab\tseparated\tcaption",
    "line one\nline two\r\nline three",
    "zero\u200bwidth\u200cjoiner\u200dspace\ufeffbom",
    "nul\x00char bell\x07 escape\x1b[0m del\x7f",
    "replacement \ufffd char and soft\u00adhyphen",
    "non\u00a0breaking\u2003em\u3000ideographic spaces",
    "   leading and trailing spaces   ",
    # edge cases
    "",
    " ",
    "\t\n\r  \n",
    "[CLS] [SEP] [PAD] [MASK] [UNK] literal specials",
    "##hash ##tags",
    # truncation
    LONG_CAPTION,
]


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    vocab_path, out_path = sys.argv[1], sys.argv[2]
    with open(vocab_path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    tok = BertWordPieceTokenizer(vocab_path, lowercase=True)
    cls_id, sep_id, pad_id = (tok.token_to_id(t) for t in ("[CLS]", "[SEP]", "[PAD]"))
    assert (pad_id, cls_id, sep_id) == (0, 101, 102), (pad_id, cls_id, sep_id)
    cases = []
    for text in CAPTIONS:
        ids = tok.encode(text, add_special_tokens=False).ids
        ids40 = [cls_id] + ids[: SEQ - 2] + [sep_id]
        ids40 += [pad_id] * (SEQ - len(ids40))
        cases.append({"text": text, "ids": ids, "ids40": ids40})
    out = {
        "tokenizers_version": tokenizers.__version__,
        "vocab_sha256": sha,
        "seq": SEQ,
        "cases": cases,
    }
    # One case per line keeps the file diffable.
    head = {k: v for k, v in out.items() if k != "cases"}
    lines = [json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [']
    lines += [" " + json.dumps(c, ensure_ascii=False) + "," for c in cases]
    lines[-1] = lines[-1][:-1]
    lines.append("]}")
    text = "\n".join(lines) + "\n"
    assert json.loads(text) == out
    with open(out_path, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"{len(cases)} cases -> {out_path}")


if __name__ == "__main__":
    main()
