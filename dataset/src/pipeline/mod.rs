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

mod crop;
mod decode;
#[cfg(test)]
mod tests;

pub use crop::{Crop, Region};
pub use decode::decode_dimensions;

use fast_image_resize::images::{TypedImage, TypedImageRef};
use fast_image_resize::pixels::U8x3;
use fast_image_resize::{FilterType, ResizeAlg, ResizeOptions, Resizer};
use image::{DynamicImage, ImageFormat, RgbImage};

use crop::{crop_rng, eval_region, random_resized_crop};
use decode::open;

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

    /// Resizes `region` of `rgb` to `side × side` RGB8 with the bicubic filter. Typed views
    /// of RGB8 only: `Resizer::resize` dispatches over all 13 pixel types and instantiated each
    /// one's SIMD kernels in this crate (about 90 % of its compiled code and ~2 of CI's minutes).
    fn resize(&self, rgb: &RgbImage, region: Region) -> Result<Vec<u8>, PipelineError> {
        let (width, height) = rgb.dimensions();
        let error = |source| PipelineError::Resize { width, height, source };
        let unsupported = |_| error(fast_image_resize::ResizeError::PixelTypesAreDifferent);
        let src = TypedImageRef::<U8x3>::from_buffer(width, height, rgb.as_raw()).map_err(unsupported)?;
        let mut out = vec![0u8; 3 * (self.side as usize) * (self.side as usize)];
        let mut dst = TypedImage::<U8x3>::from_buffer(self.side, self.side, &mut out).map_err(unsupported)?;
        let options = ResizeOptions::new().resize_alg(ResizeAlg::Convolution(FilterType::CatmullRom)).crop(
            region.left,
            region.top,
            region.width,
            region.height,
        );
        Resizer::new().resize_typed(&src, &mut dst, &options).map_err(error)?;
        Ok(out)
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
