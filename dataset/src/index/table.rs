//! One shard's table: where each example's members lie inside the tar, delta-coded.

use super::{IndexError, malformed};

const MAGIC: &[u8; 4] = b"DPIX";
const TABLE_VERSION: u8 = 1;
/// Fewest bytes an encoded entry can take (flags, then two one-byte varints per span for two spans).
pub(crate) const MIN_ENTRY_BYTES: usize = 5;

/// Image encodings a shard may hold; the table stores the kind so readers need no tar headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageKind {
    /// `.jpg` / `.jpeg`.
    Jpeg = 0,
    /// `.png`.
    Png = 1,
    /// `.webp`.
    Webp = 2,
}

impl ImageKind {
    /// The kind a tar member's extension names (case-insensitive); None when it is no image.
    pub fn from_ext(ext: &str) -> Option<Self> {
        match ext.to_ascii_lowercase().as_str() {
            "jpg" | "jpeg" => Some(Self::Jpeg),
            "png" => Some(Self::Png),
            "webp" => Some(Self::Webp),
            _ => None,
        }
    }

    /// The canonical extension, for messages and for rebuilding member names.
    pub fn ext(&self) -> &'static str {
        match self {
            Self::Jpeg => "jpg",
            Self::Png => "png",
            Self::Webp => "webp",
        }
    }
}

/// A member's data bytes inside its tar, so a reader can fetch it with one range read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Offset of the first data byte (past the member's tar header).
    pub offset: u64,
    /// Data length in bytes (padding excluded).
    pub len: u64,
}

impl Span {
    /// One past the last data byte; saturates, though decoded spans never overflow.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
}

/// Where one example's members lie: all a reader needs to fetch it without parsing the tar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TableEntry {
    /// How the image is encoded.
    pub image_kind: ImageKind,
    /// The image member.
    pub image: Span,
    /// The caption member (`.txt`).
    pub caption: Span,
    /// The metadata member (`.json`), when the shard has one for this example.
    pub meta: Option<Span>,
}

/// One shard's examples in tar order; local example i is `entries[i]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardTable {
    /// Entries in tar order.
    pub entries: Vec<TableEntry>,
}

impl ShardTable {
    /// The table's bytes: `DPIX`, version 1, a varint count, then per entry a flags byte and,
    /// per member, zigzag(offset − end of the previous member) and len as LEB128 varints.
    /// Spans must end at or below `i64::MAX`; a table holding others fails [`ShardTable::decode`].
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(6 + self.entries.len() * 16);
        out.extend_from_slice(MAGIC);
        out.push(TABLE_VERSION);
        put_varint(&mut out, self.entries.len() as u64);
        let mut cursor = 0u64;
        for entry in &self.entries {
            out.push(entry.image_kind as u8 | if entry.meta.is_some() { 4 } else { 0 });
            for span in [Some(entry.image), Some(entry.caption), entry.meta].into_iter().flatten() {
                put_varint(&mut out, zigzag(span.offset.wrapping_sub(cursor) as i64));
                put_varint(&mut out, span.len);
                cursor = span.offset.wrapping_add(span.len);
            }
        }
        out
    }

    /// Reads a table; any byte string yields a table or an error, never a panic, and memory is
    /// bounded by the input's length whatever count it claims.
    pub fn decode(bytes: &[u8]) -> Result<ShardTable, IndexError> {
        if bytes.get(..4) != Some(MAGIC.as_slice()) {
            return Err(malformed("bad magic".into()));
        }
        let mut r = Reader { bytes, pos: 4 };
        let version = r.byte()?;
        if version != TABLE_VERSION {
            return Err(malformed(format!("unknown version {version}")));
        }
        let count = r.varint()?;
        let room = (bytes.len() - r.pos) / MIN_ENTRY_BYTES;
        if count > room as u64 {
            return Err(malformed(format!("count {count} does not fit in {} bytes", bytes.len() - r.pos)));
        }
        let mut entries = Vec::with_capacity(room.min(count as usize));
        let mut cursor = 0u64;
        for _ in 0..count {
            let at = r.pos;
            let flags = r.byte()?;
            if flags & !7 != 0 {
                return Err(malformed(format!("reserved flag bits in {flags:#04x} at byte {at}")));
            }
            let kinds = [ImageKind::Jpeg, ImageKind::Png, ImageKind::Webp];
            let image_kind = *kinds
                .get(usize::from(flags & 3))
                .ok_or_else(|| malformed(format!("unknown image kind {} at byte {at}", flags & 3)))?;
            let image = r.span(&mut cursor)?;
            let caption = r.span(&mut cursor)?;
            let meta = if flags & 4 != 0 { Some(r.span(&mut cursor)?) } else { None };
            entries.push(TableEntry { image_kind, image, caption, meta });
        }
        if r.pos != bytes.len() {
            return Err(malformed(format!("{} trailing bytes at byte {}", bytes.len() - r.pos, r.pos)));
        }
        Ok(ShardTable { entries })
    }
}

pub(crate) fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

pub(crate) fn zigzag(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

fn unzigzag(value: u64) -> i64 {
    (value >> 1) as i64 ^ -((value & 1) as i64)
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, IndexError> {
        let byte = *self.bytes.get(self.pos).ok_or_else(|| malformed(format!("truncated at byte {}", self.pos)))?;
        self.pos += 1;
        Ok(byte)
    }

    fn varint(&mut self) -> Result<u64, IndexError> {
        let start = self.pos;
        let mut value = 0u64;
        for i in 0..10 {
            let byte = self.byte()?;
            let low = u64::from(byte & 0x7f);
            if i == 9 && low > 1 {
                break;
            }
            value |= low << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(malformed(format!("varint overflow at byte {start}")))
    }

    fn span(&mut self, cursor: &mut u64) -> Result<Span, IndexError> {
        let at = self.pos;
        let delta = unzigzag(self.varint()?);
        let len = self.varint()?;
        let offset = u64::try_from(i128::from(*cursor) + i128::from(delta))
            .map_err(|_| malformed(format!("offset {cursor}{delta:+} out of range at byte {at}")))?;
        *cursor =
            offset.checked_add(len).ok_or_else(|| malformed(format!("span {offset}+{len} overflows at byte {at}")))?;
        Ok(Span { offset, len })
    }
}
