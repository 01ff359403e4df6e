//! Gradient vectors on the wire: `bytes` fields holding little-endian IEEE-754 f32, 4 bytes a
//! value. A `repeated float` costs a decode loop and a copy per value at each end; bytes move
//! as whole chunks (zero-copy slices of one buffer on the sending side) and are decoded in one
//! pass into the destination.

use bytes::Bytes;

/// Why a chunk of bytes is not a run of f32 values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FloatsError {
    /// The length is not a multiple of 4.
    #[error("invalid data: {0} bytes is not a whole number of f32 values (4 bytes each)")]
    Length(usize),
    /// A value is NaN or infinite.
    #[error("invalid data: value {value} at index {index} is not finite")]
    NotFinite {
        /// The value.
        value: f32,
        /// Its index within the vector (chunk offset included).
        index: u64,
    },
}

/// `values` as little-endian bytes (one copy).
pub fn to_bytes(values: &[f32]) -> Bytes {
    #[cfg(target_endian = "little")]
    {
        Bytes::copy_from_slice(bytemuck::cast_slice(values))
    }
    #[cfg(not(target_endian = "little"))]
    {
        Bytes::from(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())
    }
}

/// `values` as little-endian bytes without a copy on little-endian hosts: the buffer becomes
/// the owner of the bytes (a 760 MB part is not duplicated to be sent).
pub fn into_bytes(values: Vec<f32>) -> Bytes {
    #[cfg(target_endian = "little")]
    {
        Bytes::from_owner(LittleEndian(values))
    }
    #[cfg(not(target_endian = "little"))]
    {
        to_bytes(&values)
    }
}

/// f32 values viewed as their little-endian bytes (the host's order).
#[cfg(target_endian = "little")]
struct LittleEndian(Vec<f32>);

#[cfg(target_endian = "little")]
impl AsRef<[u8]> for LittleEndian {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// Number of f32 values in `data`, or an error if it is not a whole number.
pub fn count(data: &[u8]) -> Result<usize, FloatsError> {
    if data.len().is_multiple_of(4) { Ok(data.len() / 4) } else { Err(FloatsError::Length(data.len())) }
}

/// Appends the values of `data` to `out`.
pub fn extend(out: &mut Vec<f32>, data: &[u8]) -> Result<(), FloatsError> {
    count(data)?;
    out.extend(le_values(data));
    Ok(())
}

/// Appends the values of `data` to `out`, refusing any value that is not finite (`offset` is
/// the index of the first value within its vector, for the error). A part with a NaN would
/// poison the sum and make the release data-dependent in its NaN pattern.
pub fn extend_finite(out: &mut Vec<f32>, data: &[u8], offset: u64) -> Result<(), FloatsError> {
    let start = out.len();
    extend(out, data)?;
    match out[start..].iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => {
            let value = out[start + i];
            out.truncate(start);
            Err(FloatsError::NotFinite { value, index: offset + i as u64 })
        }
    }
}

/// The number of f32 values in `data` and the sum of their squares (in f64, so that no finite
/// value overflows it), refusing any value that is not finite (`offset` is the index of the
/// first value within its vector, for the error). Reads `data` in place, in one pass: a part
/// is checked finite, and its norm taken, where the transport decoded it.
///
/// Compiled for AVX-512, AVX2 and NEON as well as the baseline, and run on the widest the CPU
/// has (checked once at run time): the f32 → f64 squares are 4–5× faster on AVX-512 than with
/// SSE2 alone (docs/benchmarks.md, the release's check).
#[multiversion::multiversion(targets("x86_64+avx512f+avx512bw+avx512vl", "x86_64+avx2+fma", "aarch64+neon"))]
pub fn check_finite(data: &[u8], offset: u64) -> Result<Checked, FloatsError> {
    let count = count(data)?;
    // All exponent bits set is NaN or ±inf. Blocks of 64 values are tested without a branch
    // per value, and their squares summed in 8 independent lanes (the compiler vectorises
    // both); a block with a bad value is searched again.
    let bad = |bits: u32| bits & 0x7f80_0000 == 0x7f80_0000;
    let bits = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let mut squares = 0f64;
    for (block_index, block) in data.chunks(256).enumerate() {
        let (mut any_bad, mut lanes) = (false, [0f64; 8]);
        let groups = block.chunks_exact(32);
        let tail = groups.remainder();
        for group in groups {
            for (lane, b) in lanes.iter_mut().zip(group.chunks_exact(4)) {
                let v = bits(b);
                any_bad |= bad(v);
                let x = f64::from(f32::from_bits(v));
                *lane += x * x;
            }
        }
        for b in tail.chunks_exact(4) {
            let v = bits(b);
            any_bad |= bad(v);
            lanes[0] += f64::from(f32::from_bits(v)).powi(2);
        }
        if any_bad {
            let i = block.chunks_exact(4).position(|b| bad(bits(b))).unwrap_or(0);
            let value = f32::from_bits(bits(&block[4 * i..]));
            return Err(FloatsError::NotFinite { value, index: offset + (block_index * 64 + i) as u64 });
        }
        squares += lanes.iter().sum::<f64>();
    }
    Ok(Checked { count, squares })
}

/// What [`check_finite`] found in a run of finite values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Checked {
    /// Values.
    pub count: usize,
    /// Σ x² over them, in f64.
    pub squares: f64,
}

/// The little-endian f32 values of `data`, read in place (a trailing partial value is
/// ignored: callers check the length with [`count`]).
pub fn le_values(data: &[u8]) -> impl Iterator<Item = f32> + '_ {
    data.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// All the values of `data`.
pub fn to_vec(data: &[u8]) -> Result<Vec<f32>, FloatsError> {
    let mut out = Vec::with_capacity(data.len() / 4);
    extend(&mut out, data)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_through_little_endian_bytes() {
        let values = [0.0f32, -1.5, f32::MIN_POSITIVE, 3.25e30, -0.0];
        let bytes = to_bytes(&values);
        assert_eq!(&bytes[4..8], &(-1.5f32).to_le_bytes());
        assert_eq!(to_vec(&bytes).unwrap(), values);
        assert_eq!(into_bytes(values.to_vec()), bytes, "the owned view has the same bytes");
    }

    #[test]
    fn a_ragged_length_or_a_nan_is_refused_with_its_position() {
        assert_eq!(to_vec(&[0, 0, 0]), Err(FloatsError::Length(3)));
        let mut out = vec![1.0];
        let err = extend_finite(&mut out, &to_bytes(&[2.0, f32::NAN]), 10).unwrap_err();
        assert!(matches!(err, FloatsError::NotFinite { index: 11, .. }), "{err}");
        assert_eq!(out, [1.0], "nothing of a refused chunk is kept");
    }

    #[test]
    fn a_check_in_place_finds_the_first_bad_value_in_any_block() {
        let mut values = vec![1.5f32; 1000];
        assert_eq!(check_finite(&to_bytes(&values), 0).map(|c| c.count), Ok(1000));
        for (at, bad) in [(0, f32::NAN), (63, f32::INFINITY), (64, f32::NEG_INFINITY), (999, f32::NAN)] {
            values[at] = bad;
            let err = check_finite(&to_bytes(&values), 5).unwrap_err();
            assert!(matches!(err, FloatsError::NotFinite { index, .. } if index == 5 + at as u64), "{at}: {err}");
            values[at] = f32::MAX; // the largest finite value passes
        }
        assert_eq!(check_finite(&to_bytes(&values), 0).map(|c| c.count), Ok(1000));
        assert_eq!(check_finite(&[0; 6], 0), Err(FloatsError::Length(6)));
    }

    #[test]
    fn the_check_sums_squares_in_f64_over_every_block_and_the_tail() {
        // 1001 values: 15 whole blocks of 64, and a tail of 41 (5 groups of 8 and 1 more).
        let values: Vec<f32> = (0..1001).map(|i| (i as f32 - 500.0) * 0.25).collect();
        let exact: f64 = values.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let checked = check_finite(&to_bytes(&values), 0).unwrap();
        assert_eq!(checked.count, 1001);
        assert!((checked.squares - exact).abs() <= exact * 1e-12, "{} vs {exact}", checked.squares);
        let huge = check_finite(&to_bytes(&[f32::MAX, f32::MAX]), 0).unwrap();
        assert!(huge.squares.is_finite() && huge.squares > 1e76, "no finite value overflows the sum");
    }
}
