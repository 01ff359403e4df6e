//! The pipeline's tests: formats, crops, normalisation and hostile bytes.

use super::crop::*;
use super::decode::*;
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
    0x52, 0x49, 0x46, 0x46, 0x40, 0x00, 0x00, 0x00, 0x57, 0x45, 0x42, 0x50, 0x56, 0x50, 0x38, 0x20, 0x34, 0x00, 0x00,
    0x00, 0x90, 0x01, 0x00, 0x9d, 0x01, 0x2a, 0x10, 0x00, 0x10, 0x00, 0x00, 0xc0, 0x12, 0x25, 0xa0, 0x02, 0x74, 0xba,
    0x00, 0x03, 0x98, 0x00, 0xfe, 0xfa, 0xcc, 0x7f, 0xff, 0x25, 0x1c, 0xbf, 0xf4, 0x61, 0xff, 0xf6, 0xa5, 0x9f, 0xf8,
    0x61, 0xff, 0xed, 0x4b, 0x3f, 0xfd, 0xa9, 0x65, 0xc3, 0xff, 0xda, 0x96, 0x3b, 0xa0, 0x00,
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
    assert!(matches!(pipeline.process(b"not an image at all", &Crop::Eval), Err(PipelineError::UnknownFormat { .. })));
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
    assert!(matches!(Pipeline::new(8, [f32::NAN, 0.0, 0.0], CLIP_STD), Err(PipelineError::Mean { channel: 0, .. })));
    assert!(matches!(Pipeline::clip(8).unwrap().with_max_pixels(0), Err(PipelineError::MaxPixels(0))));
}
