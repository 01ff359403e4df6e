//! Gaussian noise for releases: ChaCha20 keyed from OS entropy, with a sampler that resists
//! floating-point attacks (Mironov 2012): each coordinate's N(0, 1) is the scaled sum of four
//! independent Box–Muller draws in f64, so the low-order bits of one draw do not expose the
//! pattern of the underlying uniform. A seeded mode exists for tests only and is recorded in
//! every ledger charge it produces.

use std::ops::Range;

use bytes::Bytes;
use rand_chacha::ChaCha20Rng;

use crate::blocks::{Block, BlockPool};
use crate::sum::Sum;
use rand_chacha::rand_core::{Rng, SeedableRng};

/// Coordinates per independent ChaCha20 stream; blocks are filled in parallel and the result
/// does not depend on the number of threads.
const BLOCK: usize = 1 << 20;

/// Where a release's noise key comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoiseMode {
    /// A fresh 256-bit key from the operating system for every release.
    OsEntropy,
    /// A key derived from (seed, step): reproducible, for tests only.
    Seeded(u64),
}

impl NoiseMode {
    /// How the ledger records this mode.
    pub fn describe(&self) -> String {
        match self {
            NoiseMode::OsEntropy => "os-entropy".to_owned(),
            NoiseMode::Seeded(seed) => format!("insecure-seeded:{seed}"),
        }
    }

    fn key(&self, step: u64) -> Result<[u8; 32], getrandom::Error> {
        let mut key = [0u8; 32];
        match self {
            NoiseMode::OsEntropy => getrandom::fill(&mut key)?,
            NoiseMode::Seeded(seed) => {
                key[..8].copy_from_slice(&seed.to_le_bytes());
                key[8..16].copy_from_slice(&step.to_le_bytes());
                key[16..].copy_from_slice(b"dpcap-test-noise");
            }
        }
        Ok(key)
    }
}

/// Whether a release waits for a pass's threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Urgency {
    /// A release waits: the noise add, and a draw its step could not take from ahead.
    Now,
    /// None yet: a draw ahead, while the ranks compute. Its threads run at nice
    /// [`AHEAD_NICE`] (Linux), so that on the accountant's cores they yield to releases, parts
    /// and stores (a tenth of a contended core): drawn the moment the last release is stored,
    /// they used to share the cores evenly with the tail of its transfer. Whatever the cores do
    /// not need still goes to them.
    Ahead,
}

/// The nice value of threads drawing noise ahead: a tenth of a core's share when a release
/// wants the same core (CFS weights 110 and 1024). Once raised, a thread's nice value cannot
/// be lowered without privileges, so a draw taken by a release before it ends keeps it.
const AHEAD_NICE: i32 = 10;

/// Lowers the calling thread to [`AHEAD_NICE`], never raises it (a process run nicer keeps its
/// own). Linux sets a thread's own nice value this way; elsewhere the call would change the
/// whole process's, so it is not made. Best effort: a refusal leaves the thread as it was.
fn behind_releases() {
    #[cfg(target_os = "linux")]
    if rustix::process::getpriority_process(None).is_ok_and(|own| own < AHEAD_NICE) {
        let _ = rustix::process::setpriority_process(None, AHEAD_NICE);
    }
}

/// This machine's cores (1 where unknown).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Threads of the noise add: half the cores, at least one. The add is memory-bound (per
/// coordinate it reads 4 bytes of part and 8 of noise and writes 4), and it leaves the other
/// half free for the release's fetches and store, which take each block as it is filled: on 2
/// cores one add thread instead of two cost the release less CPU per GB and no wall time
/// (docs/benchmarks.md). A draw is compute-bound and takes every core.
fn add_threads() -> usize {
    (cores() / 2).max(1)
}

/// Runs `work` on every item on `threads` threads. Items are taken in order, one at a time,
/// so the first results are ready first (a release streams its blocks in order); an item is
/// always the same work, so results never depend on the number of threads. The threads carry
/// `name`, so that a profile (and the release bench, [`DRAW_THREAD`]) can tell them apart.
fn par_each<T: Send>(
    name: &str,
    urgency: Urgency,
    threads: usize,
    items: impl Iterator<Item = T> + Send,
    work: impl Fn(T) + Sync,
) {
    let items = std::sync::Mutex::new(items);
    // The lock is held only to take the next item, never while working on it.
    let next = || items.lock().expect("items lock").next();
    let (next, work) = (&next, &work);
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            let thread = std::thread::Builder::new().name(name.to_owned());
            thread
                .spawn_scoped(scope, move || {
                    if urgency == Urgency::Ahead {
                        behind_releases();
                    }
                    while let Some(item) = next() {
                        work(item);
                    }
                })
                .expect("a noise thread starts");
        }
    });
}

/// The name of the threads that draw noise: ahead of a step, off its release's critical path.
pub const DRAW_THREAD: &str = "noise-draw";

/// The name of the threads that add noise to a sum: a release's pass.
const ADD_THREAD: &str = "noise-add";

/// `dim` coordinates of N(0, std²) noise for `step` (f64), drawn on every core. `std` is σ·C.
/// Noise does not depend on the gradient, so it can be drawn before the step's parts arrive;
/// callers draw it at most once per step and never release it before the step's charge.
#[cfg(any(test, feature = "bench"))]
pub fn draw(dim: usize, std: f64, mode: NoiseMode, step: u64) -> Result<Vec<f64>, getrandom::Error> {
    draw_into(Vec::new(), dim, std, mode, step, Urgency::Now)
}

/// [`draw`] into `out`, a buffer an earlier step's noise used: every one of its `dim` values
/// is drawn again, so nothing of that noise is left (a freed 1.5 GB buffer at P = 190M costs a
/// release its unmapping, and the next draw its page faults).
pub fn draw_into(
    mut out: Vec<f64>,
    dim: usize,
    std: f64,
    mode: NoiseMode,
    step: u64,
    urgency: Urgency,
) -> Result<Vec<f64>, getrandom::Error> {
    let key = mode.key(step)?;
    out.resize(dim, 0.0);
    par_each(DRAW_THREAD, urgency, cores(), out.chunks_mut(BLOCK).enumerate(), |(index, block)| {
        let mut rng = ChaCha20Rng::from_seed(key);
        rng.set_stream(index as u64);
        fill_block(&mut rng, block, std);
    });
    Ok(out)
}

/// Bytes per release block: the unit the noise pass fills and a fetch or the store waits for.
pub const BLOCK_BYTES: usize = 4 * BLOCK;

/// The release bytes: `(sum + noise) as f32` per coordinate, little-endian, block by block
/// ([`BLOCK_BYTES`]) on half the cores ([`add_threads`]), each block handed to `sink` as soon as it
/// is done, in about the order of the blocks. The f64 addition happens before the single
/// rounding to f32. Noise may run past the sum: those coordinates (an audit's reserved ones)
/// are noise alone. The pass writes every value of a block once, as f32 values that become its
/// bytes without a copy; the sum is read where it lies. A single part's own pooled blocks
/// become the release's: each value is read and written back in place, which spares the pass
/// a third stream of memory (a fresh block is read in before it is written; the add alone
/// 0.23 → 0.12 CPU-s/GB at P = 190M, docs/benchmarks.md). Other blocks come from `pool` and
/// hold whatever they last held (a release, another rank's part) until every value is written
/// here.
///
/// A block with a value that is not finite once cast to f32 (a sum and noise past f32's range)
/// is never handed to `sink`, and the pass returns [`NotFinite`]: such a release is refused
/// (its step, charged, is discarded), never served.
pub fn apply_each(
    mut sum: Sum,
    noise: &[f64],
    pool: &BlockPool,
    sink: impl Fn(usize, Bytes) + Sync,
) -> Result<(), NotFinite> {
    assert!(sum.len() <= noise.len(), "noise drawn for another dimension");
    let blocks = noise.len().div_ceil(BLOCK);
    // A block's values are read as little-endian f32 in place: only where that is native.
    let owned = match &mut sum {
        Sum::One(chunks) if cfg!(target_endian = "little") => chunks.take_blocks(BLOCK, noise.len()),
        _ => Vec::new(),
    };
    let items = owned.into_iter().chain(std::iter::repeat_with(|| None)).take(blocks).enumerate();
    let bad = std::sync::Mutex::new(None);
    par_each(ADD_THREAD, Urgency::Now, add_threads(), items, |(index, owned): (usize, Option<Block>)| {
        let (start, end) = (index * BLOCK, ((index + 1) * BLOCK).min(noise.len()));
        let (mut block, any_bad) = match owned {
            Some(mut block) => {
                let any_bad = add_in_place(block.values_mut(), &noise[start..end]);
                (block, any_bad)
            }
            None => add_block(pool.block(end - start), &sum, noise, start..end),
        };
        if any_bad {
            let at = block.values_mut().iter().position(|v| !v.is_finite()).unwrap_or(0);
            // The lowest bad coordinate, whatever order the threads found their blocks in.
            let found = NotFinite { index: (start + at) as u64 };
            let mut bad = bad.lock().expect("bad lock");
            if bad.is_none_or(|seen: NotFinite| seen.index > found.index) {
                *bad = Some(found);
            }
            return;
        }
        sink(index, block.into_bytes());
    });
    bad.into_inner().expect("bad lock").map_or(Ok(()), Err)
}

/// Writes block `range` of the release into `block` (its length) from the sum and the noise;
/// true when a value is not finite.
fn add_block(mut block: Block, sum: &Sum, noise: &[f64], range: Range<usize>) -> (Block, bool) {
    let Range { start, end } = range;
    let summed = end.min(sum.len()).max(start); // this block's coordinates with a sum
    let (head, tail) = block.values_mut().split_at_mut(summed - start);
    let mut any_bad = false;
    match sum {
        Sum::Empty => {}
        Sum::One(chunks) => {
            let mut at = start;
            for bytes in chunks.slices(start..summed) {
                let n = bytes.len() / 4;
                any_bad |= add_le(&mut head[at - start..][..n], bytes, &noise[at..at + n]);
                at += n;
            }
            assert_eq!(at, summed, "the part's chunks cover the block's summed values");
        }
        Sum::Many(values) => {
            let (values, noise) = (&values[start..summed], &noise[start..summed]);
            assert_eq!((values.len(), noise.len()), (head.len(), head.len()), "every summed value");
            any_bad |= add_values(head, values, noise);
        }
    }
    any_bad |= noise_alone(tail, &noise[summed..end]);
    (block, any_bad)
}

/// A released value that is not finite after its cast to f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the release's value at index {index} is not finite after its cast to f32")]
pub struct NotFinite {
    /// Its coordinate.
    pub index: u64,
}

/// Writes `values` into `out` as f32, each rounded once; true when one is not finite (all
/// exponent bits set: NaN or ±inf). Tested without a branch per value, so that the pass stays
/// one vectorised sweep (a second sweep to look for bad values cost as much as a copy).
#[inline(always)]
fn write_checked(out: &mut [f32], values: impl Iterator<Item = f64>) -> bool {
    let mut bad = 0u32;
    for (y, v) in out.iter_mut().zip(values) {
        *y = v as f32;
        bad |= not_finite(*y);
    }
    bad != 0
}

/// 1 when `y` is NaN or ±inf (all exponent bits set), else 0: a mask, not a branch.
#[inline(always)]
fn not_finite(y: f32) -> u32 {
    const EXPONENT: u32 = 0x7f80_0000;
    u32::from(y.to_bits() & EXPONENT == EXPONENT)
}

/// `values[i] = (values[i] + noise[i]) as f32`, in place (a part's own block becoming the
/// release's); true when one is not finite.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512bw+avx512vl", "x86_64+avx2+fma", "aarch64+neon"))]
fn add_in_place(values: &mut [f32], noise: &[f64]) -> bool {
    assert_eq!(values.len(), noise.len(), "noise for every value");
    let mut bad = 0u32;
    for (y, n) in values.iter_mut().zip(noise) {
        *y = (f64::from(*y) + n) as f32;
        bad |= not_finite(*y);
    }
    bad != 0
}

/// `out[i] = (x[i] + noise[i]) as f32` for the little-endian f32 values `x` of `bytes`; true
/// when one is not finite. Compiled for the widest vector unit too (as the part's check is):
/// the f32 → f64 → f32 conversions are most of the pass's instructions.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512bw+avx512vl", "x86_64+avx2+fma", "aarch64+neon"))]
fn add_le(out: &mut [f32], bytes: &[u8], noise: &[f64]) -> bool {
    let sums = dpcap_proto::floats::le_values(bytes).zip(noise).map(|(x, n)| f64::from(x) + n);
    write_checked(out, sums)
}

/// `out[i] = (values[i] + noise[i]) as f32`; true when one is not finite.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512bw+avx512vl", "x86_64+avx2+fma", "aarch64+neon"))]
fn add_values(out: &mut [f32], values: &[f64], noise: &[f64]) -> bool {
    write_checked(out, values.iter().zip(noise).map(|(x, n)| x + n))
}

/// `out[i] = noise[i] as f32` (coordinates past the sum); true when one is not finite.
#[multiversion::multiversion(targets("x86_64+avx512f+avx512bw+avx512vl", "x86_64+avx2+fma", "aarch64+neon"))]
fn noise_alone(out: &mut [f32], noise: &[f64]) -> bool {
    write_checked(out, noise.iter().copied())
}

/// [`apply_each`] into one buffer (tests; the release path streams blocks).
#[cfg(test)]
pub fn apply(sum: Sum, noise: &[f64]) -> Vec<u8> {
    let out = std::sync::Mutex::new(vec![0u8; noise.len() * 4]);
    apply_each(sum, noise, &BlockPool::new(BLOCK), |index, block| {
        out.lock().expect("out lock")[index * BLOCK_BYTES..][..block.len()].copy_from_slice(&block);
    })
    .expect("finite release");
    out.into_inner().expect("out lock")
}

fn fill_block(rng: &mut ChaCha20Rng, output: &mut [f64], std: f64) {
    let scale = std / 2.0; // the sum of four N(0,1) has std 2
    for y in output.iter_mut() {
        let (a, b) = box_muller(rng);
        let (c, d) = box_muller(rng);
        *y = scale * (a + b + c + d);
    }
}

/// Two independent N(0, 1) draws from two uniforms in (0, 1] with 53 random bits each.
fn box_muller(rng: &mut ChaCha20Rng) -> (f64, f64) {
    const SCALE: f64 = 1.0 / (1u64 << 53) as f64;
    let u1 = ((rng.next_u64() >> 11) + 1) as f64 * SCALE;
    let u2 = (rng.next_u64() >> 11) as f64 * SCALE;
    let r = (-2.0 * u1.ln()).sqrt();
    let (s, c) = (std::f64::consts::TAU * u2).sin_cos();
    (r * c, r * s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nice value of each thread that `urgency`'s pass ran its items on.
    #[cfg(target_os = "linux")]
    fn nice_values(urgency: Urgency) -> Vec<i32> {
        let seen = std::sync::Mutex::new(Vec::new());
        par_each("test", urgency, cores(), 0..64, |_| {
            let nice = rustix::process::getpriority_process(None).unwrap();
            seen.lock().unwrap().push(nice);
        });
        seen.into_inner().unwrap()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn noise_drawn_ahead_runs_behind_releases_and_a_release_pass_does_not() {
        let own = rustix::process::getpriority_process(None).unwrap();
        // At least AHEAD_NICE: a process already nicer than that keeps its own.
        assert!(nice_values(Urgency::Ahead).iter().all(|nice| *nice == own.max(AHEAD_NICE)));
        assert!(nice_values(Urgency::Now).iter().all(|nice| *nice == own), "a release's pass keeps its priority");
        assert_eq!(rustix::process::getpriority_process(None).unwrap(), own, "the caller's own is untouched");
    }

    fn ones(dim: usize) -> Sum {
        let mut sum = Sum::default();
        sum.add(crate::sum::Chunks::from(vec![1.0; dim]));
        sum
    }

    /// A single part as a transport hands it on: checked into blocks of `pool`, its own.
    fn pooled(values: &[f32], pool: &BlockPool) -> Sum {
        let (mut chunks, mut filler) = (crate::sum::Chunks::default(), crate::blocks::Filler::new(pool, values.len()));
        let bytes = dpcap_proto::floats::to_bytes(values);
        filler
            .fill(&bytes, |block| {
                chunks.push_block(block);
                Ok::<_, ()>(())
            })
            .unwrap();
        let mut sum = Sum::default();
        sum.add(chunks);
        sum
    }

    /// A sum of two parts of `dim` values.
    fn two(dim: usize) -> Sum {
        let mut many = ones(dim);
        many.add(crate::sum::Chunks::from(vec![2.0; dim]));
        many
    }

    /// One release as the accountant makes it: noise drawn for `step`, added to ones.
    fn release(dim: usize, std: f64, mode: NoiseMode, step: u64) -> Vec<u8> {
        apply(ones(dim), &draw(dim, std, mode, step).unwrap())
    }

    #[test]
    fn seeded_noise_is_reproducible_and_step_dependent() {
        let a = release(3000, 1.0, NoiseMode::Seeded(7), 3);
        let b = release(3000, 1.0, NoiseMode::Seeded(7), 3);
        let c = release(3000, 1.0, NoiseMode::Seeded(7), 4);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn os_entropy_noise_differs_between_calls() {
        let a = release(64, 1.0, NoiseMode::OsEntropy, 0);
        let b = release(64, 1.0, NoiseMode::OsEntropy, 0);
        assert_ne!(a, b);
    }

    #[test]
    fn a_single_parts_own_blocks_become_its_release_with_the_bytes_a_fresh_block_would_hold() {
        let dim = 2 * BLOCK + 77;
        let values: Vec<f32> = (0..dim).map(|i| (i % 1013) as f32 * 1e-3 - 0.5).collect();
        let pool = BlockPool::new(BLOCK);
        // Noise for the sum alone, and running past it (an audit's reserved coordinates: the
        // part's short last block is then read, and a block of the pool written).
        for extra in [0, 9] {
            let noise = draw(dim + extra, 1.0, NoiseMode::Seeded(3), 5).unwrap();
            let sum = pooled(&values, &pool);
            let Sum::One(chunks) = &sum else { panic!("one part") };
            let held: Vec<*const u8> = chunks.slices(0..dim).map(<[u8]>::as_ptr).collect();
            let released = std::sync::Mutex::new(Vec::new());
            apply_each(sum, &noise, &pool, |index, block| released.lock().unwrap().push((index, block))).unwrap();
            let mut released = released.into_inner().unwrap();
            released.sort_by_key(|(index, _)| *index);
            let at: Vec<*const u8> = released.iter().map(|(_, block)| block.as_ptr()).collect();
            let in_place = if extra == 0 { 3 } else { 2 };
            assert_eq!(at[..in_place], held[..in_place], "the part's blocks, written in place");
            let bytes: Vec<u8> = released.iter().flat_map(|(_, block)| block.to_vec()).collect();
            let mut shared = Sum::default();
            shared.add(crate::sum::Chunks::from(values.clone()));
            assert!(bytes == apply(shared, &noise), "the same release as from a block of the pool");
        }
    }

    #[test]
    fn a_single_parts_release_gives_its_blocks_back_for_the_next_part_and_nothing_is_allocated() {
        let (dim, pool) = (2 * BLOCK + 5, BlockPool::new(BLOCK));
        pool.expect_step(dim);
        let noise = draw(dim, 1.0, NoiseMode::Seeded(2), 0).unwrap();
        let buffers = |sum: &Sum| -> std::collections::BTreeSet<usize> {
            let Sum::One(chunks) = sum else { panic!("one part") };
            chunks.slices(0..dim).map(|s| s.as_ptr() as usize).collect()
        };
        let part = pooled(&vec![1.0; dim], &pool);
        let held = buffers(&part);
        let release = std::sync::Mutex::new(Vec::new());
        apply_each(part, &noise, &pool, |_, block| release.lock().unwrap().push(block)).unwrap();
        drop(release); // pushed out of memory, as a running job's oldest kept release
        let next = pooled(&vec![2.0; dim], &pool);
        assert_eq!(buffers(&next), held, "the next part is checked into the same three blocks");
    }

    #[test]
    fn noise_spans_several_blocks_and_has_the_asked_spread() {
        let dim = 2 * BLOCK + 12_345;
        let noise = draw(dim, 3.0, NoiseMode::Seeded(1), 0).unwrap();
        let mean = noise.iter().sum::<f64>() / dim as f64;
        let var = noise.iter().map(|n| (n - mean).powi(2)).sum::<f64>() / dim as f64;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var.sqrt() - 3.0).abs() < 0.01, "std {}", var.sqrt());
        assert_ne!(noise[..BLOCK], noise[BLOCK..2 * BLOCK], "blocks use independent streams");
        let released = apply(ones(dim), &noise);
        let last = dim - 1;
        let value = f32::from_le_bytes(released[last * 4..].try_into().unwrap());
        assert_eq!(value, (1.0 + noise[last]) as f32);
    }

    #[test]
    fn a_part_in_chunks_that_straddle_blocks_releases_the_same_bytes_as_one_buffer() {
        let dim = 2 * BLOCK + 77;
        let values: Vec<f32> = (0..dim).map(|i| (i % 1013) as f32 * 1e-3).collect();
        let mut chunked = crate::sum::Chunks::default();
        for piece in values.chunks(BLOCK / 3 + 5) {
            chunked.push(dpcap_proto::floats::to_bytes(piece));
        }
        let (mut whole, mut parts) = (Sum::default(), Sum::default());
        whole.add(crate::sum::Chunks::from(values));
        parts.add(chunked);
        let noise = draw(dim, 1.0, NoiseMode::Seeded(9), 2).unwrap();
        assert_eq!(apply(parts, &noise), apply(whole, &noise));
    }

    #[test]
    fn coordinates_past_the_sum_are_noise_alone_in_the_same_pass() {
        // A sum ending inside the second block, noise running into a third.
        let (dim, extra) = (BLOCK + 5, BLOCK + 7);
        let noise = draw(dim + extra, 2.0, NoiseMode::Seeded(4), 1).unwrap();
        let released = apply(ones(dim), &noise);
        assert_eq!(released.len(), 4 * (dim + extra));
        let at = |i: usize| f32::from_le_bytes(released[4 * i..4 * i + 4].try_into().unwrap());
        for i in [0, dim - 1] {
            assert_eq!(at(i), (1.0 + noise[i]) as f32, "coordinate {i} of the sum");
        }
        for i in [dim, dim + 1, BLOCK * 2, dim + extra - 1] {
            assert_eq!(at(i), noise[i] as f32, "reserved coordinate {i}");
        }
    }

    #[test]
    fn a_release_from_reused_blocks_holds_nothing_of_what_they_held_before() {
        // Blocks that held another job's values (here NaN, which no release can hold) are
        // reused: every value of every kind of sum must be written over.
        let pool = BlockPool::new(BLOCK);
        pool.expect_step(3 * BLOCK);
        let poisoned: Vec<_> = (0..6).map(|_| pool.block(BLOCK)).collect();
        let poisoned = poisoned.into_iter().map(|mut block| {
            block.values_mut().fill(f32::NAN);
            block
        });
        drop(poisoned.collect::<Vec<_>>());
        let dim = BLOCK + 321;
        let noise = draw(dim + 17, 1.0, NoiseMode::Seeded(3), 0).unwrap();
        // A single part checked into the reused blocks, then written over in place.
        let sums: [&dyn Fn() -> Sum; 4] =
            [&Sum::default, &|| ones(dim), &|| two(dim), &|| pooled(&vec![3.0; dim], &pool)];
        for sum in sums {
            let fresh = apply(sum(), &noise);
            let reused = std::sync::Mutex::new(vec![0u8; fresh.len()]);
            apply_each(sum(), &noise, &pool, |index, block| {
                reused.lock().unwrap()[index * BLOCK_BYTES..][..block.len()].copy_from_slice(&block);
            })
            .unwrap();
            assert_eq!(reused.into_inner().unwrap(), fresh, "a sum of {} values", sum().len());
        }
    }

    #[test]
    fn noise_drawn_into_a_used_buffer_is_the_noise_drawn_afresh() {
        let dim = BLOCK + 99;
        for used in [vec![f64::NAN; dim], vec![f64::NAN; 3 * dim], vec![f64::NAN; 7]] {
            let again = draw_into(used, dim, 2.0, NoiseMode::Seeded(8), 4, Urgency::Ahead).unwrap();
            assert_eq!(again, draw(dim, 2.0, NoiseMode::Seeded(8), 4).unwrap());
        }
    }

    #[test]
    fn a_nan_or_an_infinity_in_a_sum_of_many_or_in_the_noise_alone_is_refused() {
        let dim = BLOCK + 3;
        let pool = BlockPool::new(BLOCK);
        for (at, bad) in [(5, f64::NAN), (BLOCK + 1, f64::NEG_INFINITY), (BLOCK + 2, -1e300)] {
            let mut noise = draw(dim + 4, 1.0, NoiseMode::Seeded(6), 0).unwrap();
            noise[at] = bad;
            let refused = apply_each(two(dim), &noise, &pool, |_, _| {});
            assert_eq!(refused, Err(NotFinite { index: at as u64 }), "{bad} in a sum of two parts");
            let mut noise = draw(dim + 4, 1.0, NoiseMode::Seeded(6), 0).unwrap();
            noise[dim + 2] = bad; // a coordinate past the sum: noise alone
            let refused = apply_each(ones(dim), &noise, &pool, |_, _| {});
            assert_eq!(refused, Err(NotFinite { index: dim as u64 + 2 }), "{bad} in the noise alone");
        }
    }

    /// Bites where the add has two threads or more (4 cores and up): the blocks then finish in
    /// any order.
    #[test]
    fn the_first_bad_coordinate_is_reported_whichever_block_finished_first() {
        let dim = 4 * BLOCK;
        let mut noise = draw(dim, 1.0, NoiseMode::Seeded(6), 0).unwrap();
        for at in [3 * BLOCK + 1, BLOCK + 7, 2 * BLOCK] {
            noise[at] = f64::NAN;
        }
        let pool = BlockPool::new(BLOCK);
        for sum in [ones(dim), pooled(&vec![1.0; dim], &pool), ones(dim), pooled(&vec![1.0; dim], &pool)] {
            let refused = apply_each(sum, &noise, &pool, |_, _| {});
            assert_eq!(refused, Err(NotFinite { index: BLOCK as u64 + 7 }));
        }
    }

    /// Bites on 2 to 15 cores (CI has 2): past that, 8 blocks fit under half the cores.
    #[test]
    fn the_noise_add_leaves_half_the_cores_to_the_transfer_of_its_blocks() {
        let dim = 8 * BLOCK;
        let noise = draw(dim, 1.0, NoiseMode::Seeded(7), 0).unwrap();
        let threads = std::sync::Mutex::new(std::collections::HashSet::new());
        apply_each(ones(dim), &noise, &BlockPool::new(BLOCK), |_, _| {
            let thread = std::thread::current();
            assert_eq!(thread.name(), Some(ADD_THREAD));
            threads.lock().unwrap().insert(thread.id());
        })
        .unwrap();
        let used = threads.into_inner().unwrap().len();
        assert!(used <= (cores() / 2).max(1), "{used} add threads on {} cores", cores());
    }

    #[test]
    fn a_release_past_f32s_range_is_refused_and_its_block_never_handed_out() {
        let dim = BLOCK + 3;
        let mut noise = draw(dim, 1.0, NoiseMode::Seeded(5), 0).unwrap();
        noise[BLOCK + 1] = 1e300; // finite in f64, +inf once cast to f32
        let pool = BlockPool::new(BLOCK);
        // From a block of the pool, and in place in a single part's own.
        for sum in [ones(dim), pooled(&vec![1.0; dim], &pool)] {
            let handed = std::sync::Mutex::new(Vec::new());
            let refused = apply_each(sum, &noise, &pool, |index, _| handed.lock().unwrap().push(index));
            assert_eq!(refused, Err(NotFinite { index: BLOCK as u64 + 1 }));
            assert_eq!(handed.into_inner().unwrap(), [0], "only the finite block reached the release");
        }
    }
}
