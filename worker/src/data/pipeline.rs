//! The image pipeline for training and evaluation: encoded bytes (JPEG, PNG or WebP, told apart
//! by their first bytes) → RGB8 → crop and resize (bicubic, SIMD, by `fast_image_resize`) →
//! a channel-major `[3, side, side]` f32 tensor normalised as `(x/255 − mean)/std`.
//!
//! Two crops:
//! - [`Crop::Train`]: torchvision's `RandomResizedCrop` (scale (0.08, 1), ratio (3/4, 4/3) drawn
//!   in log space, 10 attempts, then a centre crop at the clamped ratio), drawn from a ChaCha20
//!   stream keyed by the job secret and (step, example), so a retried step sees the same pixels.
//! - [`Crop::Eval`]: torchvision's `Resize(side)` (shorter side to `side`) then `CenterCrop(side)`.
//!
//! Both resize with the Catmull-Rom bicubic filter (a = −0.5, support widened by the scale
//! when shrinking): the same filter as Pillow's `Image.BICUBIC` and as CLIP's preprocessing, so
//! `reference/pillow_pipeline.py` gives the same tensor up to JPEG-decoder and rounding
//! differences. Eval resizes only the source region that survives the centre crop (a
//! fractional crop box in source pixels, the same sampling positions as resize-then-crop), so
//! it never computes the columns or rows the crop would throw away.
//!
//! Images are not rotated by their EXIF orientation (neither Pillow's `open` nor torchvision
//! does), and alpha is dropped, not composited (as Pillow's `convert("RGB")`).
//!
//! Decoding is single-threaded and allocation-bounded; callers run [`Pipeline::process`] on a
//! pool of their own. Images over [`Pipeline::max_pixels`] are refused from their header, before
//! any pixel buffer is allocated (decompression bombs).

use std::io::Cursor;

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits, RgbImage};
use rand_chacha::ChaCha20Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// Per-channel RGB mean of CLIP's (and DP-Cap's) training images, in units of x/255.
#[allow(clippy::excessive_precision)] // OpenAI CLIP's published values, verbatim
pub const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
/// Per-channel RGB standard deviation matching [`CLIP_MEAN`], in units of x/255.
#[allow(clippy::excessive_precision)] // OpenAI CLIP's published values, verbatim
pub const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_58, 0.275_777_11];
/// Default cap on width × height (8192 × 8192 = 64 Mi pixels): larger images are refused from
/// their header. At 8 bytes a pixel (16-bit RGBA PNG) the decoded buffer stays under 512 MiB.
pub const DEFAULT_MAX_PIXELS: u64 = 8192 * 8192;
/// `RandomResizedCrop`'s range for the crop's area as a fraction of the image's (torchvision's
/// default).
pub const TRAIN_SCALE: (f64, f64) = (0.08, 1.0);
/// `RandomResizedCrop`'s range for the crop's width/height ratio, sampled uniformly in log
/// space (torchvision's default).
pub const TRAIN_RATIO: (f64, f64) = (3.0 / 4.0, 4.0 / 3.0);
/// Draws of (area, ratio) before `RandomResizedCrop` falls back to a centre crop (torchvision's).
const TRAIN_ATTEMPTS: usize = 10;
/// Where in the job key's ChaCha20 stream `step` the per-step crop key is read: block 2⁶³
/// (word 2⁶⁷). The coordinator's Poisson sampler reads the same key and stream from block 0
/// onward and would need 2⁶⁹ bytes to get here, so crop randomness never reuses (or reveals)
/// the sampler's keystream.
const CROP_KEY_WORD_POS: u128 = 1 << 67;
/// Largest output side accepted: 8192 px; beyond that the f32 output alone passes 800 MB.
const MAX_SIDE: u32 = 8192;

/// Why an image could not be turned into a tensor, or a pipeline could not be built. Every
/// variant is an error in the input, never a panic.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The requested output side is zero or larger than 8192.
    #[error("output side {0} px is outside 1..=8192")]
    Side(u32),
    /// A normalisation mean is NaN or infinite.
    #[error("normalisation mean {value} for channel {channel} is not finite")]
    Mean {
        /// Channel index, 0 = R.
        channel: usize,
        /// The offending mean.
        value: f32,
    },
    /// A normalisation std is not a finite positive number (dividing by it would give inf/NaN).
    #[error("normalisation std {value} for channel {channel} is not finite and positive")]
    Std {
        /// Channel index, 0 = R.
        channel: usize,
        /// The offending std.
        value: f32,
    },
    /// The pixel limit is zero.
    #[error("pixel limit {0} must be positive")]
    MaxPixels(u64),
    /// The first bytes match no known image format.
    #[error("image format not recognised from its first bytes {magic:02x?} ({len} bytes in all)")]
    UnknownFormat {
        /// Up to the first 12 bytes.
        magic: Vec<u8>,
        /// Length of the whole input.
        len: usize,
    },
    /// A known format that this pipeline does not decode (only JPEG, PNG and WebP).
    #[error("image format {0:?} is not supported (only jpeg, png and webp)")]
    UnsupportedFormat(ImageFormat),
    /// The header could not be parsed (truncated or corrupt file).
    #[error("image header unreadable: {0}")]
    Header(#[source] image::ImageError),
    /// A JPEG whose bytes end before its end-of-image marker, or a WebP shorter than its RIFF
    /// header says. The decoders would fill the missing part (grey rows, zero bits) and
    /// succeed; Pillow refuses such files, and so do we.
    #[error("{format} is truncated: its {len} bytes end before the {expected}")]
    Truncated {
        /// "jpeg" or "webp".
        format: &'static str,
        /// Length of the input, bytes.
        len: usize,
        /// What is missing: the end-of-image marker, or the RIFF size in bytes.
        expected: String,
    },
    /// The header claims a zero width or height.
    #[error("image is {width}x{height}: it has no pixels")]
    Empty {
        /// Width from the header, px.
        width: u32,
        /// Height from the header, px.
        height: u32,
    },
    /// The header claims more pixels than the limit (a decompression bomb, or simply too big).
    #[error("image is {width}x{height} = {pixels} pixels, over the limit of {limit}")]
    TooLarge {
        /// Width from the header, px.
        width: u32,
        /// Height from the header, px.
        height: u32,
        /// width × height.
        pixels: u64,
        /// The pipeline's limit.
        limit: u64,
    },
    /// The pixel data could not be decoded (truncated or corrupt after a valid header).
    #[error("image data undecodable: {0}")]
    Decode(#[source] image::ImageError),
    /// Resizing failed (an internal invariant; reported rather than panicking).
    #[error("resizing a {width}x{height} image failed: {source}")]
    Resize {
        /// Source width, px.
        width: u32,
        /// Source height, px.
        height: u32,
        /// What fast_image_resize said.
        #[source]
        source: fast_image_resize::ResizeError,
    },
}

/// How an image is cropped before it is resized to `side × side`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Crop {
    /// Training augmentation: torchvision's `RandomResizedCrop`, drawn from a ChaCha20 stream
    /// that is a pure function of (key, step, example), so a retried step crops identically and
    /// every (step, example) gets its own independent-looking crop.
    ///
    /// Derivation: the per-step crop key is the 32 bytes of ChaCha20(`key`, stream = `step`)
    /// starting at block 2⁶³ (a region the coordinator's sampler, which uses the same key and
    /// stream from block 0, never reaches); the crop's randomness is ChaCha20(crop key,
    /// stream = `example`) from block 0. Distinct (step, example) pairs get distinct streams for
    /// every u64 value of each, with no range split between them.
    Train {
        /// The job's 256-bit augmentation key (the coordinator derives it one-way from the
        /// sampler's secret, which never reaches a worker).
        key: [u8; 32],
        /// Training step (the sampler's step number).
        step: u64,
        /// The example's index in the dataset.
        example: u64,
    },
    /// Evaluation: shorter side resized to `side`, then the centre `side × side`. Deterministic.
    Eval,
}

/// A crop rectangle in source pixels. Fractional for [`Crop::Eval`] (resize-then-crop expressed
/// in source coordinates), whole pixels for [`Crop::Train`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Region {
    /// Left edge, px from the image's left.
    pub left: f64,
    /// Top edge, px from the image's top.
    pub top: f64,
    /// Width, px.
    pub width: f64,
    /// Height, px.
    pub height: f64,
}

/// Turns encoded images into normalised `[3, side, side]` tensors. Cheap to build and `Sync`:
/// share one across a decode pool.
#[derive(Debug, Clone, PartialEq)]
pub struct Pipeline {
    /// Output side, px.
    side: u32,
    /// Per-channel mean, in units of x/255.
    mean: [f32; 3],
    /// Per-channel std, in units of x/255.
    std: [f32; 3],
    /// Refuse images with more pixels than this (from the header).
    max_pixels: u64,
}

impl Pipeline {
    /// A pipeline producing `side × side` tensors normalised with `mean` and `std` (per RGB
    /// channel, in units of x/255), refusing images over [`DEFAULT_MAX_PIXELS`].
    pub fn new(side: u32, mean: [f32; 3], std: [f32; 3]) -> Result<Self, PipelineError> {
        if side == 0 || side > MAX_SIDE {
            return Err(PipelineError::Side(side));
        }
        for (channel, (&m, &s)) in mean.iter().zip(&std).enumerate() {
            if !m.is_finite() {
                return Err(PipelineError::Mean { channel, value: m });
            }
            if !(s.is_finite() && s > 0.0) {
                return Err(PipelineError::Std { channel, value: s });
            }
        }
        Ok(Self { side, mean, std, max_pixels: DEFAULT_MAX_PIXELS })
    }

    /// A pipeline with CLIP's normalisation ([`CLIP_MEAN`], [`CLIP_STD`]), as DP-Cap uses.
    pub fn clip(side: u32) -> Result<Self, PipelineError> {
        Self::new(side, CLIP_MEAN, CLIP_STD)
    }

    /// The same pipeline with another cap on width × height (pixels), e.g. lower for workers
    /// with little memory per decode thread.
    pub fn with_max_pixels(mut self, max_pixels: u64) -> Result<Self, PipelineError> {
        if max_pixels == 0 {
            return Err(PipelineError::MaxPixels(max_pixels));
        }
        self.max_pixels = max_pixels;
        Ok(self)
    }

    /// Output side, px.
    pub fn side(&self) -> u32 {
        self.side
    }

    /// The cap on width × height, pixels.
    pub fn max_pixels(&self) -> u64 {
        self.max_pixels
    }

    /// Decodes `bytes` (JPEG, PNG or WebP, guessed from the bytes), crops and resizes as `crop`
    /// says, and normalises: the result is channel-major `[3, side, side]` (R plane, G plane,
    /// B plane, each row-major), `(x/255 − mean)/std`.
    pub fn process(&self, bytes: &[u8], crop: &Crop) -> Result<Vec<f32>, PipelineError> {
        let rgb = self.decode(bytes)?;
        self.transform(&rgb, crop)
    }

    /// The decode half of [`Pipeline::process`]: header checks (format, size limit), then the
    /// pixels converted to RGB8 (grey expanded, alpha dropped, 16-bit scaled down).
    pub fn decode(&self, bytes: &[u8]) -> Result<RgbImage, PipelineError> {
        let decoder = open(bytes, self.max_pixels)?;
        let image = DynamicImage::from_decoder(decoder).map_err(PipelineError::Decode)?;
        Ok(image.into_rgb8())
    }

    /// The crop-resize-normalise half of [`Pipeline::process`], on already-decoded pixels.
    pub fn transform(&self, rgb: &RgbImage, crop: &Crop) -> Result<Vec<f32>, PipelineError> {
        let (width, height) = rgb.dimensions();
        if width == 0 || height == 0 {
            return Err(PipelineError::Empty { width, height });
        }
        let region = self.region(width, height, crop);
        let pixels = self.resize(rgb, region)?;
        Ok(self.normalise(&pixels))
    }

    /// The source rectangle that `crop` takes from a `width × height` image (px); what
    /// [`Pipeline::transform`] resizes to `side × side`. Both sizes must be positive.
    pub fn region(&self, width: u32, height: u32, crop: &Crop) -> Region {
        match crop {
            Crop::Train { key, step, example } => {
                random_resized_crop(width, height, &mut crop_rng(key, *step, *example))
            }
            Crop::Eval => eval_region(width, height, self.side),
        }
    }

    /// Resizes `region` of `rgb` to `side × side` RGB8 with the bicubic filter.
    fn resize(&self, rgb: &RgbImage, region: Region) -> Result<Vec<u8>, PipelineError> {
        let (width, height) = rgb.dimensions();
        let error = |source| PipelineError::Resize { width, height, source };
        let src = ImageRef::new(width, height, rgb.as_raw(), PixelType::U8x3)
            .map_err(|_| error(fast_image_resize::ResizeError::PixelTypesAreDifferent))?;
        let mut dst = Image::new(self.side, self.side, PixelType::U8x3);
        let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::CatmullRom)).crop(
            region.left,
            region.top,
            region.width,
            region.height,
        );
        Resizer::new().resize(&src, &mut dst, &options).map_err(error)?;
        Ok(dst.into_vec())
    }

    /// RGB8 interleaved → channel-major f32, `(x/255 − mean)/std` as one multiply and one add.
    fn normalise(&self, pixels: &[u8]) -> Vec<f32> {
        let plane = (self.side as usize) * (self.side as usize);
        let scale: [f32; 3] = std::array::from_fn(|c| 1.0 / (255.0 * self.std[c]));
        let bias: [f32; 3] = std::array::from_fn(|c| -self.mean[c] / self.std[c]);
        let mut out = vec![0.0f32; 3 * plane];
        let (r, rest) = out.split_at_mut(plane);
        let (g, b) = rest.split_at_mut(plane);
        for (((px, r), g), b) in pixels.chunks_exact(3).zip(r).zip(g).zip(b) {
            // Plain multiply-add, not f32::mul_add: without `target-feature=+fma` that is a
            // libm call per value, which cost more than the resize.
            *r = f32::from(px[0]) * scale[0] + bias[0];
            *g = f32::from(px[1]) * scale[1] + bias[1];
            *b = f32::from(px[2]) * scale[2] + bias[2];
        }
        out
    }
}

/// Width and height (px) from the image's header alone, without decoding pixels: a cheap check
/// at index time that an example is a readable JPEG, PNG or WebP. Compare the product with
/// [`Pipeline::max_pixels`] to drop images the pipeline will refuse.
pub fn decode_dimensions(bytes: &[u8]) -> Result<(u32, u32), PipelineError> {
    let decoder = open(bytes, u64::MAX)?;
    Ok(decoder.dimensions())
}

/// Parses the header: format from the first bytes (JPEG, PNG, WebP only), then dimensions,
/// refused if empty or over `max_pixels`. No pixel buffer is allocated here.
fn open(bytes: &[u8], max_pixels: u64) -> Result<impl ImageDecoder + '_, PipelineError> {
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
fn jpeg_is_complete(bytes: &[u8]) -> bool {
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

/// The crop randomness for (key, step, example); see [`Crop::Train`] for the derivation.
fn crop_rng(key: &[u8; 32], step: u64, example: u64) -> ChaCha20Rng {
    let mut job = ChaCha20Rng::from_seed(*key);
    job.set_stream(step);
    job.set_word_pos(CROP_KEY_WORD_POS);
    let mut step_key = [0u8; 32];
    job.fill_bytes(&mut step_key);
    let mut rng = ChaCha20Rng::from_seed(step_key);
    rng.set_stream(example);
    rng
}

/// Uniform in [lo, hi) from 53 random bits.
fn uniform(rng: &mut ChaCha20Rng, lo: f64, hi: f64) -> f64 {
    let unit = (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    lo + (hi - lo) * unit
}

/// Uniform integer in [0, n), unbiased (Lemire's multiply-and-reject). `n` must be positive.
fn below(rng: &mut ChaCha20Rng, n: u64) -> u64 {
    let threshold = n.wrapping_neg() % n;
    loop {
        let product = u128::from(rng.next_u64()) * u128::from(n);
        if (product as u64) >= threshold {
            return (product >> 64) as u64;
        }
    }
}

/// torchvision's `RandomResizedCrop.get_params` with the default scale and ratio. Rounding is
/// Python's `round` (ties to even), as torchvision's.
fn random_resized_crop(width: u32, height: u32, rng: &mut ChaCha20Rng) -> Region {
    let (w, h) = (f64::from(width), f64::from(height));
    let area = w * h;
    let (log_lo, log_hi) = (TRAIN_RATIO.0.ln(), TRAIN_RATIO.1.ln());
    for _ in 0..TRAIN_ATTEMPTS {
        let target = area * uniform(rng, TRAIN_SCALE.0, TRAIN_SCALE.1);
        let ratio = uniform(rng, log_lo, log_hi).exp();
        let crop_w = (target * ratio).sqrt().round_ties_even();
        let crop_h = (target / ratio).sqrt().round_ties_even();
        if crop_w > 0.0 && crop_w <= w && crop_h > 0.0 && crop_h <= h {
            // Top first, then left, as torchvision draws them.
            let top = below(rng, (h - crop_h) as u64 + 1) as f64;
            let left = below(rng, (w - crop_w) as u64 + 1) as f64;
            return Region { left, top, width: crop_w, height: crop_h };
        }
    }
    // Fallback: the largest centred crop whose ratio is clamped into the range.
    let ratio = w / h;
    let (crop_w, crop_h) = if ratio < TRAIN_RATIO.0 {
        (w, (w / TRAIN_RATIO.0).round_ties_even().min(h))
    } else if ratio > TRAIN_RATIO.1 {
        ((h * TRAIN_RATIO.1).round_ties_even().min(w), h)
    } else {
        (w, h)
    };
    Region { left: ((w - crop_w) / 2.0).floor(), top: ((h - crop_h) / 2.0).floor(), width: crop_w, height: crop_h }
}

/// torchvision's `Resize(side)` then `CenterCrop(side)`, as a rectangle in source pixels: the
/// resized size is (side, ⌊side·long/short⌋), the crop offset Python-rounds half the excess, and
/// the rectangle is that crop scaled back by source/resized per axis.
fn eval_region(width: u32, height: u32, side: u32) -> Region {
    let (resized_w, resized_h) = if width <= height {
        (u64::from(side), u64::from(side) * u64::from(height) / u64::from(width))
    } else {
        (u64::from(side) * u64::from(width) / u64::from(height), u64::from(side))
    };
    let axis = |source: u32, resized: u64| {
        let scale = f64::from(source) / resized as f64;
        let offset = ((resized - u64::from(side)) as f64 / 2.0).round_ties_even();
        let start = offset * scale;
        let end = ((offset + f64::from(side)) * scale).min(f64::from(source));
        (start, end - start)
    };
    let (left, crop_w) = axis(width, resized_w);
    let (top, crop_h) = axis(height, resized_h);
    Region { left, top, width: crop_w, height: crop_h }
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::codecs::jpeg::JpegEncoder;
    use image::codecs::png::PngEncoder;
    use image::codecs::webp::WebPEncoder;
    use image::{ExtendedColorType, ImageEncoder, Rgb};

    const KEY: [u8; 32] = [7; 32];

    /// A smooth, asymmetric test picture (every pixel distinct enough that crops differ).
    fn picture(width: u32, height: u32) -> RgbImage {
        RgbImage::from_fn(width, height, |x, y| {
            Rgb([(x * 255 / width.max(2)) as u8, (y * 255 / height.max(2)) as u8, ((x * 7 + y * 13) % 256) as u8])
        })
    }

    fn jpeg(image: &RgbImage) -> Vec<u8> {
        let mut out = Vec::new();
        JpegEncoder::new_with_quality(&mut out, 90)
            .write_image(image.as_raw(), image.width(), image.height(), ExtendedColorType::Rgb8)
            .unwrap();
        out
    }

    fn png(image: &RgbImage) -> Vec<u8> {
        let mut out = Vec::new();
        PngEncoder::new(&mut out)
            .write_image(image.as_raw(), image.width(), image.height(), ExtendedColorType::Rgb8)
            .unwrap();
        out
    }

    fn webp(image: &RgbImage) -> Vec<u8> {
        let mut out = Vec::new();
        WebPEncoder::new_lossless(&mut out)
            .write_image(image.as_raw(), image.width(), image.height(), ExtendedColorType::Rgb8)
            .unwrap();
        out
    }

    /// A 16×16 lossy (VP8) WebP, left half RGB (200, 40, 40), right half (40, 40, 200), made
    /// with Pillow 13: `im.save(f, "WEBP", quality=90)`. Pillow decodes it to (199, 40, 39) at
    /// (2, 8) and (41, 40, 199) at (13, 8).
    const LOSSY_WEBP: &[u8] = &[
        0x52, 0x49, 0x46, 0x46, 0x40, 0x00, 0x00, 0x00, 0x57, 0x45, 0x42, 0x50, 0x56, 0x50, 0x38, 0x20, 0x34, 0x00,
        0x00, 0x00, 0x90, 0x01, 0x00, 0x9d, 0x01, 0x2a, 0x10, 0x00, 0x10, 0x00, 0x00, 0xc0, 0x12, 0x25, 0xa0, 0x02,
        0x74, 0xba, 0x00, 0x03, 0x98, 0x00, 0xfe, 0xfa, 0xcc, 0x7f, 0xff, 0x25, 0x1c, 0xbf, 0xf4, 0x61, 0xff, 0xf6,
        0xa5, 0x9f, 0xf8, 0x61, 0xff, 0xed, 0x4b, 0x3f, 0xfd, 0xa9, 0x65, 0xc3, 0xff, 0xda, 0x96, 0x3b, 0xa0, 0x00,
    ];

    fn train(step: u64, example: u64) -> Crop {
        Crop::Train { key: KEY, step, example }
    }

    #[test]
    fn output_is_three_planes_of_side_squared_within_the_normalised_range() {
        let pipeline = Pipeline::clip(32).unwrap();
        let bytes = png(&picture(100, 60));
        for crop in [Crop::Eval, train(0, 0)] {
            let out = pipeline.process(&bytes, &crop).unwrap();
            assert_eq!(out.len(), 3 * 32 * 32);
            for (c, plane) in out.chunks_exact(32 * 32).enumerate() {
                let lo = (0.0 - CLIP_MEAN[c]) / CLIP_STD[c] - 1e-4;
                let hi = (1.0 - CLIP_MEAN[c]) / CLIP_STD[c] + 1e-4;
                assert!(plane.iter().all(|v| (lo..=hi).contains(v)), "channel {c} out of range");
            }
        }
    }

    #[test]
    fn normalisation_maps_a_solid_colour_to_its_formula_value_per_channel() {
        let pipeline = Pipeline::new(8, [0.5, 0.25, 0.0], [0.5, 0.25, 2.0]).unwrap();
        let solid = RgbImage::from_pixel(20, 10, Rgb([255, 0, 51]));
        let out = pipeline.process(&png(&solid), &Crop::Eval).unwrap();
        let want = [(1.0 - 0.5) / 0.5, (0.0 - 0.25) / 0.25, (0.2 - 0.0) / 2.0];
        for (c, plane) in out.chunks_exact(64).enumerate() {
            assert!(plane.iter().all(|v| (v - want[c]).abs() < 1e-5), "channel {c}: {} vs {}", plane[0], want[c]);
        }
    }

    #[test]
    fn jpeg_png_and_webp_all_decode_to_the_same_picture() {
        let pipeline = Pipeline::clip(16).unwrap();
        let image = picture(48, 40);
        let from_png = pipeline.process(&png(&image), &Crop::Eval).unwrap();
        let from_webp = pipeline.process(&webp(&image), &Crop::Eval).unwrap();
        let from_jpeg = pipeline.process(&jpeg(&image), &Crop::Eval).unwrap();
        // Lossless formats agree exactly; JPEG within its quantisation error.
        assert_eq!(from_png, from_webp);
        let worst = from_png.iter().zip(&from_jpeg).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
        assert!(worst < 0.5, "jpeg differs by {worst}");
        assert_eq!(decode_dimensions(&webp(&image)).unwrap(), (48, 40));
        assert_eq!(decode_dimensions(&jpeg(&image)).unwrap(), (48, 40));
    }

    #[test]
    fn lossy_webp_decodes_to_its_two_colours() {
        let rgb = Pipeline::clip(8).unwrap().decode(LOSSY_WEBP).unwrap();
        assert_eq!(rgb.dimensions(), (16, 16));
        for ((x, y), want) in [((2, 8), [199u8, 40, 39]), ((13, 8), [41, 40, 199])] {
            let Rgb(got) = *rgb.get_pixel(x, y);
            assert!(got.iter().zip(want).all(|(g, w)| g.abs_diff(w) <= 3), "({x}, {y}): {got:?} vs {want:?}");
        }
    }

    #[test]
    fn grey_and_alpha_pngs_become_rgb() {
        let grey = image::GrayImage::from_fn(10, 10, |x, _| image::Luma([x as u8 * 20]));
        let mut bytes = Vec::new();
        PngEncoder::new(&mut bytes).write_image(grey.as_raw(), 10, 10, ExtendedColorType::L8).unwrap();
        let rgb = Pipeline::clip(4).unwrap().decode(&bytes).unwrap();
        assert_eq!(*rgb.get_pixel(3, 5), Rgb([60, 60, 60]));
        let rgba = image::RgbaImage::from_pixel(6, 6, image::Rgba([10, 20, 30, 0]));
        let mut bytes = Vec::new();
        PngEncoder::new(&mut bytes).write_image(rgba.as_raw(), 6, 6, ExtendedColorType::Rgba8).unwrap();
        let rgb = Pipeline::clip(4).unwrap().decode(&bytes).unwrap();
        assert_eq!(*rgb.get_pixel(0, 0), Rgb([10, 20, 30]));
    }

    #[test]
    fn the_same_key_step_and_example_give_identical_output() {
        let pipeline = Pipeline::clip(24).unwrap();
        let bytes = png(&picture(120, 90));
        let a = pipeline.process(&bytes, &train(5, 17)).unwrap();
        let b = pipeline.process(&bytes, &train(5, 17)).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn a_different_example_step_or_key_gives_a_different_crop() {
        let pipeline = Pipeline::clip(24).unwrap();
        let bytes = png(&picture(120, 90));
        let base = pipeline.process(&bytes, &train(5, 17)).unwrap();
        for other in [train(5, 18), train(6, 17), train(17, 5), Crop::Train { key: [8; 32], step: 5, example: 17 }] {
            assert_ne!(pipeline.process(&bytes, &other).unwrap(), base, "{other:?}");
        }
        // And across many (step, example) the regions are (almost) all distinct.
        let mut regions: Vec<[u64; 4]> = (0..20u64)
            .flat_map(|s| (0..20u64).map(move |e| (s, e)))
            .map(|(s, e)| {
                let r = pipeline.region(1000, 800, &train(s, e));
                [r.left, r.top, r.width, r.height].map(|v| v as u64)
            })
            .collect();
        regions.sort_unstable();
        regions.dedup();
        assert!(regions.len() > 390, "only {} distinct regions of 400", regions.len());
    }

    #[test]
    fn train_regions_follow_random_resized_crop_bounds() {
        let pipeline = Pipeline::clip(24).unwrap();
        let (w, h) = (640.0, 480.0);
        let mut area_fractions = Vec::new();
        for example in 0..2000 {
            let r = pipeline.region(640, 480, &train(1, example));
            assert!(r.left >= 0.0 && r.top >= 0.0 && r.left + r.width <= w && r.top + r.height <= h, "{r:?}");
            assert_eq!(r.left.fract() + r.top.fract() + r.width.fract() + r.height.fract(), 0.0);
            let ratio = r.width / r.height;
            assert!(ratio > 0.74 && ratio < 1.35, "ratio {ratio}");
            area_fractions.push(r.width * r.height / (w * h));
        }
        let (lo, hi) = area_fractions.iter().fold((1.0f64, 0.0f64), |(lo, hi), &a| (lo.min(a), hi.max(a)));
        assert!(lo < 0.1 && lo > 0.07 && hi > 0.9, "area fractions span {lo}..{hi}");
    }

    #[test]
    fn a_very_wide_image_falls_back_to_a_centred_crop_at_the_clamped_ratio() {
        // 1000×10: no crop with ratio ≤ 4/3 has area ≥ 8% of it, so all 10 attempts fail.
        let r = Pipeline::clip(8).unwrap().region(1000, 10, &train(0, 0));
        assert_eq!(r, Region { left: 493.0, top: 0.0, width: 13.0, height: 10.0 });
    }

    #[test]
    fn eval_is_deterministic_and_centred_excluding_a_border() {
        // 400×300 with a 40-px red border around a blue interior: the resize to 224 on the
        // short side gives 298×224, the centre crop keeps source x ∈ [62, 338), y ∈ [0, 300).
        // So the left/right border is cut, the top/bottom border (full height kept) is not.
        let image = RgbImage::from_fn(400, 300, |x, y| {
            if (40..360).contains(&x) && (40..260).contains(&y) { Rgb([0, 0, 255]) } else { Rgb([255, 0, 0]) }
        });
        let pipeline = Pipeline::clip(224).unwrap();
        let bytes = png(&image);
        let a = pipeline.process(&bytes, &Crop::Eval).unwrap();
        assert_eq!(a, pipeline.process(&bytes, &Crop::Eval).unwrap());
        let region = pipeline.region(400, 300, &Crop::Eval);
        assert_eq!(region.top, 0.0);
        assert_eq!(region.height, 300.0);
        assert!((region.left - 37.0 * 400.0 / 298.0).abs() < 1e-9, "{region:?}");
        assert!((region.left + region.width / 2.0 - 200.0).abs() < 1.0, "not centred: {region:?}");
        let red = (1.0 - CLIP_MEAN[0]) / CLIP_STD[0];
        let at = |c: usize, x: usize, y: usize| a[c * 224 * 224 + y * 224 + x];
        // Left and right columns, mid-height: blue interior (no red border).
        for x in [0, 223] {
            assert!(at(0, x, 112) < 0.0 && at(2, x, 112) > 1.0, "x={x}: {}", at(0, x, 112));
        }
        // Top and bottom rows: red border.
        for y in [0, 223] {
            assert!((at(0, 112, y) - red).abs() < 0.05, "y={y}: {}", at(0, 112, y));
        }
    }

    #[test]
    fn eval_region_matches_torchvision_rounding() {
        let side = 224;
        // 500×375 → 298×224, left = round(37.0) = 37.
        let r = eval_region(500, 375, side);
        assert!((r.left - 37.0 * 500.0 / 298.0).abs() < 1e-9 && r.top == 0.0);
        // 375×500 → 224×298, top = 37.
        let r = eval_region(375, 500, side);
        assert!((r.top - 37.0 * 500.0 / 298.0).abs() < 1e-9 && r.left == 0.0);
        // 301×224 → 301×224, excess 77, Python round(38.5) = 38 (ties to even).
        let r = eval_region(301, 224, side);
        assert_eq!((r.left, r.width), (38.0, 224.0));
        // Upscaling a small image: 20×10 → 448×224, left = 112, in source 112·20/448 = 5.
        let r = eval_region(20, 10, side);
        assert_eq!((r.left, r.top, r.width, r.height), (5.0, 0.0, 10.0, 10.0));
    }

    #[test]
    fn corrupt_and_truncated_bytes_give_errors_not_panics() {
        let pipeline = Pipeline::clip(16).unwrap();
        let image = picture(40, 30);
        assert!(matches!(pipeline.process(b"", &Crop::Eval), Err(PipelineError::UnknownFormat { .. })));
        assert!(matches!(
            pipeline.process(b"not an image at all", &Crop::Eval),
            Err(PipelineError::UnknownFormat { .. })
        ));
        assert!(matches!(decode_dimensions(b"GIF89a\x01\x00\x01\x00"), Err(PipelineError::UnsupportedFormat(_))));
        for bytes in [jpeg(&image), png(&image), webp(&image), LOSSY_WEBP.to_vec()] {
            // Every truncation is refused (JPEG by its missing end-of-image marker, WebP by its
            // RIFF size; a lossy WebP cut by one zero byte decodes identically), except a PNG
            // cut inside its final 12-byte IEND chunk: all pixels are there, and the PNG decoder
            // (like Pillow) stops after the image data.
            let must_fail = if bytes.starts_with(b"\x89PNG") { bytes.len() - 12 } else { bytes.len() };
            for len in 0..bytes.len() {
                let result = pipeline.process(&bytes[..len], &Crop::Eval);
                assert!(len >= must_fail || result.is_err(), "{:x?}.. cut to {len} bytes decoded", &bytes[..4]);
                let _ = decode_dimensions(&bytes[..len]);
            }
            // Deterministic byte corruption after the magic.
            let mut state = 0x9e37_79b9_7f4a_7c15u64;
            for _ in 0..300 {
                let mut bad = bytes.clone();
                for _ in 0..4 {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let at = 4 + (state >> 33) as usize % (bad.len() - 4);
                    bad[at] ^= (state >> 25) as u8 | 1;
                }
                let _ = pipeline.process(&bad, &train(0, 0));
            }
        }
    }

    #[test]
    fn a_truncated_file_is_an_error_but_trailing_bytes_after_a_jpeg_are_not() {
        let pipeline = Pipeline::clip(16).unwrap();
        let image = picture(40, 30);
        for bytes in [png(&image), webp(&image)] {
            let err = pipeline.process(&bytes[..bytes.len() - 10], &Crop::Eval).unwrap_err();
            assert!(matches!(err, PipelineError::Decode(_) | PipelineError::Truncated { .. }), "{err}");
        }
        // zune-jpeg alone would decode these (grey rows); the marker walk refuses them, even
        // at index time.
        let full = jpeg(&image);
        for cut in [2, full.len() / 2] {
            let err = decode_dimensions(&full[..full.len() - cut]).unwrap_err();
            assert!(matches!(err, PipelineError::Truncated { format: "jpeg", .. }), "{err}");
        }
        let err = decode_dimensions(&LOSSY_WEBP[..LOSSY_WEBP.len() - 1]).unwrap_err();
        assert!(matches!(err, PipelineError::Truncated { format: "webp", len: 71, .. }), "{err}");
        assert!(err.to_string().contains("72 bytes"), "{err}");
        let mut padded = full.clone();
        padded.extend_from_slice(&[0, 0, 0xff, 0xd8, 1, 2, 3]);
        assert_eq!(pipeline.process(&padded, &Crop::Eval).unwrap(), pipeline.process(&full, &Crop::Eval).unwrap());
    }

    #[test]
    fn an_image_over_the_pixel_limit_is_refused_from_its_header() {
        // A real 8×8 JPEG whose SOF0 header is patched to claim 65000×65000 (4.2 G pixels):
        // refused before any pixel buffer exists, with the size in the message.
        let mut bytes = jpeg(&picture(8, 8));
        let sof = bytes.windows(2).position(|w| w == [0xff, 0xc0]).expect("baseline jpeg has SOF0");
        bytes[sof + 5..sof + 9].copy_from_slice(&[0xfd, 0xe8, 0xfd, 0xe8]);
        assert_eq!(decode_dimensions(&bytes).unwrap(), (65000, 65000));
        let err = Pipeline::clip(224).unwrap().process(&bytes, &Crop::Eval).unwrap_err();
        assert!(matches!(err, PipelineError::TooLarge { width: 65000, height: 65000, .. }), "{err}");
        assert!(err.to_string().contains("65000x65000"), "{err}");
        // A lowered limit refuses an honest image the same way.
        let small = Pipeline::clip(8).unwrap().with_max_pixels(40 * 30 - 1).unwrap();
        let err = small.process(&png(&picture(40, 30)), &Crop::Eval).unwrap_err();
        assert!(matches!(err, PipelineError::TooLarge { pixels: 1200, limit: 1199, .. }), "{err}");
    }

    #[test]
    fn invalid_settings_are_refused() {
        assert!(matches!(Pipeline::clip(0), Err(PipelineError::Side(0))));
        assert!(matches!(Pipeline::new(8, CLIP_MEAN, [0.2, 0.0, 0.2]), Err(PipelineError::Std { channel: 1, .. })));
        assert!(matches!(
            Pipeline::new(8, [f32::NAN, 0.0, 0.0], CLIP_STD),
            Err(PipelineError::Mean { channel: 0, .. })
        ));
        assert!(matches!(Pipeline::clip(8).unwrap().with_max_pixels(0), Err(PipelineError::MaxPixels(0))));
    }
}
