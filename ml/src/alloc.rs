//! The C allocator's settings for a process that runs training steps.
//!
//! A step allocates and frees the same large activations, gradients and per-layer products
//! every time (about 300 MB of them for the `bench` captioner at batch 64). With glibc's
//! defaults, buffers over its moving mmap threshold come from fresh `mmap`s and go back with
//! `munmap`, and a freed heap top over 128 KiB is trimmed: each step then pays the kernel to
//! fault in and zero the same pages again. Keeping buffers up to 32 MiB on the heap and
//! trimming only past 256 MiB made the DP step 7-9 % faster and the non-private step 2-4 %
//! (docs/benchmarks.md), with the same peak RSS. Buffers past 32 MiB (P-sized vectors at the
//! paper's sizes, 760 MB) still get their own mappings and are returned when freed.
//!
//! This is the crate's only `unsafe`: one call into the C library, with no pointers.
#![allow(unsafe_code)]

/// Allocations at or under this many bytes come from the heap and are reused once freed.
pub const MMAP_THRESHOLD: usize = 32 << 20;

/// Freed memory at the top of a heap is returned to the system only past this many bytes.
pub const TRIM_THRESHOLD: usize = 256 << 20;

/// Applies [`MMAP_THRESHOLD`] and [`TRIM_THRESHOLD`] to glibc's malloc (no-op elsewhere).
/// Returns whether the C library took both.
pub fn keep_step_buffers() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt takes two integers and changes the allocator's parameters under its
        // own lock; it reads and writes no memory of ours.
        let set = |param, value: usize| unsafe { libc::mallopt(param, value as libc::c_int) } == 1;
        set(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) && set(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64"))]
    fn glibc_takes_both_settings() {
        // glibc refuses an mmap threshold over half its arena heap size (32 MiB on 64-bit).
        assert!(super::keep_step_buffers());
    }
}
