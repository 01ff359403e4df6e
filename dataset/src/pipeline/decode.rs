//! Headers and decoding: the format from the first bytes, the size before any pixel buffer,
//! and truncated files refused.

use std::io::Cursor;

use image::{ImageDecoder, ImageFormat, ImageReader, Limits};

use super::PipelineError;

/// Width and height (px) from the image's header alone, without decoding pixels: a cheap check
/// at index time that an example is a readable JPEG, PNG or WebP. Compare the product with
/// [`Pipeline::max_pixels`] to drop images the pipeline will refuse.
pub fn decode_dimensions(bytes: &[u8]) -> Result<(u32, u32), PipelineError> {
    let decoder = open(bytes, u64::MAX)?;
    Ok(decoder.dimensions())
}

/// Parses the header: format from the first bytes (JPEG, PNG, WebP only), then dimensions,
/// refused if empty or over `max_pixels`. No pixel buffer is allocated here.
pub(super) fn open(bytes: &[u8], max_pixels: u64) -> Result<impl ImageDecoder + '_, PipelineError> {
    let mut reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| PipelineError::Header(image::ImageError::IoError(e)))?;
    match reader.format() {
        Some(ImageFormat::Jpeg) => {
            if !jpeg_is_complete(bytes) {
                let expected = "end-of-image marker".to_string();
                return Err(PipelineError::Truncated { format: "jpeg", len: bytes.len(), expected });
            }
        }
        Some(ImageFormat::WebP) => {
            // "RIFF", u32 LE size of what follows the first 8 bytes, "WEBP" (the guess saw all 12).
            let riff = bytes.get(4..8).and_then(|s| <[u8; 4]>::try_from(s).ok()).map(u32::from_le_bytes);
            let want = riff.map_or(usize::MAX, |size| (size as usize).saturating_add(8));
            if bytes.len() < want {
                let expected = format!("{want} bytes its riff header declares");
                return Err(PipelineError::Truncated { format: "webp", len: bytes.len(), expected });
            }
        }
        Some(ImageFormat::Png) => {}
        Some(other) => return Err(PipelineError::UnsupportedFormat(other)),
        None => {
            return Err(PipelineError::UnknownFormat {
                magic: bytes[..bytes.len().min(12)].to_vec(),
                len: bytes.len(),
            });
        }
    }
    // Bound the decoders' own allocations too: 8 bytes a pixel covers 16-bit RGBA plus slack.
    let mut limits = Limits::default();
    limits.max_alloc = Some(max_pixels.saturating_mul(8).max(64 << 20));
    reader.limits(limits);
    let decoder = reader.into_decoder().map_err(PipelineError::Header)?;
    let (width, height) = decoder.dimensions();
    if width == 0 || height == 0 {
        return Err(PipelineError::Empty { width, height });
    }
    let pixels = u64::from(width) * u64::from(height);
    if pixels > max_pixels {
        return Err(PipelineError::TooLarge { width, height, pixels, limit: max_pixels });
    }
    Ok(decoder)
}

/// Whether a JPEG's marker structure runs from SOI to an EOI marker: segments are skipped by
/// their lengths, entropy-coded data is scanned for the next marker (0xFF followed by neither a
/// stuffed 0x00 nor a restart marker). One linear pass over the bytes, no decoding. Catches
/// truncated files, which the decoder (non-strict zune-jpeg) would otherwise accept.
pub(super) fn jpeg_is_complete(bytes: &[u8]) -> bool {
    let mut at = 2; // past SOI (FF D8), which format guessing has already seen
    loop {
        if bytes.get(at) != Some(&0xff) {
            return false;
        }
        while bytes.get(at) == Some(&0xff) {
            at += 1; // the marker's 0xFF and any fill bytes
        }
        let Some(&marker) = bytes.get(at) else { return false };
        at += 1;
        match marker {
            0xd9 => return true,
            0x01 | 0xd0..=0xd7 => continue, // TEM and RSTn stand alone
            _ => {}
        }
        let (Some(&hi), Some(&lo)) = (bytes.get(at), bytes.get(at + 1)) else { return false };
        let length = usize::from(u16::from_be_bytes([hi, lo]));
        if length < 2 || at + length > bytes.len() {
            return false;
        }
        at += length;
        if marker == 0xda {
            // Entropy-coded data up to the next real marker.
            loop {
                let Some(offset) = bytes[at..].iter().position(|&b| b == 0xff) else { return false };
                at += offset;
                match bytes.get(at + 1) {
                    None => return false,
                    Some(0x00 | 0xd0..=0xd7) => at += 2,
                    Some(_) => break,
                }
            }
        }
    }
}
