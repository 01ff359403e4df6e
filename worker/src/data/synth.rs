//! A synthetic captioning dataset: 32×32 images of two coloured shapes, captions that describe
//! them ("a small red circle above a large blue square") and a class label (the first shape's
//! colour and kind, 12 classes); and a probe split of single shapes anywhere on the canvas
//! ("a large red circle", labelled by colour and kind), on which a linear probe asks whether
//! an encoder's pooled features say *what* is in the image wherever it is. Every example is a
//! pure function of (seed, index), so shards can be regenerated and checked.

use std::fs::File;
use std::io::{self, BufWriter};
use std::path::{Path, PathBuf};

use image::{ImageBuffer, Rgb, RgbImage};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// Shape kinds, in label order.
pub const SHAPES: [&str; 3] = ["circle", "square", "triangle"];
/// Colour names and RGB values, in label order.
pub const COLOURS: [(&str, [u8; 3]); 4] =
    [("red", [220, 40, 40]), ("green", [40, 190, 60]), ("blue", [50, 80, 230]), ("yellow", [230, 210, 40])];
/// Number of classes: colour × shape of the first object.
pub const CLASSES: usize = SHAPES.len() * COLOURS.len();

/// One generated example.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthExample {
    /// WebDataset key.
    pub key: String,
    /// The caption.
    pub caption: String,
    /// Class of the first object: colour · 3 + shape.
    pub label: u32,
    /// The image.
    pub image: RgbImage,
}

#[derive(Debug, Clone, Copy)]
struct Object {
    shape: usize,
    colour: usize,
    large: bool,
}

fn draw(img: &mut RgbImage, o: Object, cx: f32, cy: f32) {
    let r = if o.large { 7.0 } else { 4.0 };
    let colour = Rgb(COLOURS[o.colour].1);
    for y in 0..img.height() {
        for x in 0..img.width() {
            let (dx, dy) = (x as f32 + 0.5 - cx, y as f32 + 0.5 - cy);
            let inside = match o.shape {
                0 => dx * dx + dy * dy <= r * r,
                1 => dx.abs() <= r && dy.abs() <= r,
                _ => dy <= r && dy >= -r && dx.abs() <= (dy + r) / 2.0,
            };
            if inside {
                img.put_pixel(x, y, colour);
            }
        }
    }
}

/// Example `index` of the dataset with `seed`, on a `side`×`side` canvas (side ≥ 32).
pub fn generate(seed: u64, index: u64, side: u32) -> SynthExample {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(index);
    let mut pick = |n: usize| (rng.next_u64() % n as u64) as usize;
    let object = |pick: &mut dyn FnMut(usize) -> usize| Object {
        shape: pick(SHAPES.len()),
        colour: pick(COLOURS.len()),
        large: pick(2) == 1,
    };
    let (a, b) = (object(&mut pick), object(&mut pick));
    let vertical = pick(2) == 0;
    let jitter = (pick(5) as f32 - 2.0, pick(5) as f32 - 2.0);
    let mut img: RgbImage = ImageBuffer::from_fn(side, side, |_, _| Rgb([24, 24, 28]));
    let (s, q) = (side as f32, side as f32 / 4.0);
    let (pa, pb) = if vertical { ((s / 2.0, q), (s / 2.0, 3.0 * q)) } else { ((q, s / 2.0), (3.0 * q, s / 2.0)) };
    draw(&mut img, a, pa.0 + jitter.0, pa.1 + jitter.1);
    draw(&mut img, b, pb.0 - jitter.0, pb.1 - jitter.1);
    let describe =
        |o: Object| format!("{} {} {}", if o.large { "large" } else { "small" }, COLOURS[o.colour].0, SHAPES[o.shape]);
    let relation = if vertical { "above" } else { "left of" };
    SynthExample {
        key: format!("{index:09}"),
        caption: format!("a {} {relation} a {}", describe(a), describe(b)),
        label: (a.colour * SHAPES.len() + a.shape) as u32,
        image: img,
    }
}

/// Probe example `index`: one shape of random colour, kind and size at a random position.
pub fn generate_single(seed: u64, index: u64, side: u32) -> SynthExample {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x0050_524f_4245);
    rng.set_stream(index);
    let mut pick = |n: usize| (rng.next_u64() % n as u64) as usize;
    let o = Object { shape: pick(SHAPES.len()), colour: pick(COLOURS.len()), large: pick(2) == 1 };
    let margin = if o.large { 8 } else { 5 };
    let span = side as usize - 2 * margin;
    let (cx, cy) = ((margin + pick(span)) as f32, (margin + pick(span)) as f32);
    let mut img: RgbImage = ImageBuffer::from_fn(side, side, |_, _| Rgb([24, 24, 28]));
    draw(&mut img, o, cx, cy);
    let size = if o.large { "large" } else { "small" };
    SynthExample {
        key: format!("{index:09}"),
        caption: format!("a {size} {} {}", COLOURS[o.colour].0, SHAPES[o.shape]),
        label: (o.colour * SHAPES.len() + o.shape) as u32,
        image: img,
    }
}

/// Which generator a split uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scene {
    /// Two shapes with a relation caption ([`generate`]): training and held-out caption splits.
    Pair,
    /// One shape anywhere ([`generate_single`]): the linear-probe split.
    Single,
}

/// Writes examples `indices` of `scene` as WebDataset tar shards of `shard_size` examples
/// (`KEY.png`, `KEY.txt`, `KEY.json` with the label) into `dir`; returns the shard paths.
pub fn write_shards(
    dir: &Path,
    (scene, seed): (Scene, u64),
    indices: std::ops::Range<u64>,
    shard_size: u64,
    side: u32,
) -> io::Result<Vec<PathBuf>> {
    match scene {
        Scene::Pair => write_with(dir, indices, shard_size, |index| generate(seed, index, side)),
        Scene::Single => write_with(dir, indices, shard_size, |index| generate_single(seed, index, side)),
    }
}

fn write_with(
    dir: &Path,
    indices: std::ops::Range<u64>,
    shard_size: u64,
    generate: impl Fn(u64) -> SynthExample,
) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut paths = Vec::new();
    let mut start = indices.start;
    while start < indices.end {
        let end = (start + shard_size.max(1)).min(indices.end);
        let path = dir.join(format!("shard-{:05}.tar", paths.len()));
        let mut builder = tar::Builder::new(BufWriter::new(File::create(&path)?));
        for index in start..end {
            let example = generate(index);
            let mut png = Vec::new();
            example
                .image
                .write_to(&mut io::Cursor::new(&mut png), image::ImageFormat::Png)
                .map_err(io::Error::other)?;
            let label = format!("{{\"label\":{},\"class\":\"{}\"}}", example.label, class_name(example.label));
            for (ext, bytes) in
                [("png", png.as_slice()), ("txt", example.caption.as_bytes()), ("json", label.as_bytes())]
            {
                let mut header = tar::Header::new_gnu();
                header.set_size(bytes.len() as u64);
                header.set_mode(0o644);
                header.set_cksum();
                builder.append_data(&mut header, format!("{}.{ext}", example.key), bytes)?;
            }
        }
        builder.into_inner()?.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        paths.push(path);
        start = end;
    }
    Ok(paths)
}

/// "red circle" for a label.
pub fn class_name(label: u32) -> String {
    let (colour, shape) = (label as usize / SHAPES.len(), label as usize % SHAPES.len());
    format!("{} {}", COLOURS[colour].0, SHAPES[shape])
}
