//! An NCCL communicator for one generation of a job's group, through cudarc's dynamically
//! loaded NCCL. Values are staged through host memory: the ClipEngine hands over its part as
//! host f32 and the optimizer takes the release as host f32. The staging buffers, one
//! page-locked host buffer and one device buffer, live as long as the communicator, and each
//! collective copies only what its rank needs ([`super::staging`], docs/gpu.md).
//!
//! The communicator is non-blocking (`blocking = 0`): init and every enqueue return at once and
//! are then polled ([`super::settle`]) until they settle, so no thread is ever parked inside
//! NCCL. NCCL >= 2.22 connects lazily, inside the first collective's enqueue; a blocking
//! communicator would hold its lock there while a peer never arrived, and a timed-out blocking
//! init would leave its thread in `ncclCommInitRank` for good.
//!
//! The watchdog: after an enqueue settles, the stream's completion is polled (a CUDA event plus
//! `ncclCommGetAsyncError`) until a deadline. On timeout, on an NCCL error, or when
//! [`NcclGroup::abort`] is called from another thread (the session was dropped because the group
//! re-formed), the communicator is aborted with `ncclCommAbort` and the wait returns an error.
//! A communicator is never reused after an abort.

// FFI to NCCL and the CUDA driver through cudarc: the one module where unsafe code is allowed.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtrMut, DeviceRepr, PinnedHostSlice, result as driver};
use cudarc::nccl::{result as nccl, sys};

use super::CollectiveError;
use super::settle::{Progress, Watch, config_bytes, settle};
use super::staging::{Op, Transfers, grown};

// The sizes `config_bytes` gives each NCCL release, checked against cudarc's layout.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(offset_of!(sys::ncclConfig_t, trafficClass) + 4 == 48);
    assert!(offset_of!(sys::ncclConfig_t, nvlsCTAs) + 4 == 72);
    assert!(offset_of!(sys::ncclConfig_t, nvlinkCentricSched) + 4 == 80);
    assert!(offset_of!(sys::ncclConfig_t, numRmaCtx) + 4 == 88);
    assert!(size_of::<sys::ncclConfig_t>() == 96);
};

/// `NCCL_CONFIG_UNDEF_INT`: NCCL chooses the field.
const UNDEF: ::core::ffi::c_int = i32::MIN;

/// A non-blocking communicator's configuration, as `NCCL_CONFIG_INITIALIZER` fills it for the
/// NCCL that is loaded: its size is that library's, and its version never claims a layout
/// newer than cudarc's (2.30).
fn nonblocking_config() -> Result<sys::ncclConfig_t, CollectiveError> {
    let version = nccl::get_nccl_version().map_err(nccl_err("get-version"))?;
    let size = config_bytes(version)?;
    Ok(sys::ncclConfig_t {
        size,
        magic: 0xcafe_beef,
        version: version.min(23000) as ::core::ffi::c_uint,
        blocking: 0,
        cgaClusterSize: UNDEF,
        minCTAs: UNDEF,
        maxCTAs: UNDEF,
        netName: std::ptr::null(),
        splitShare: UNDEF,
        trafficClass: UNDEF,
        commName: std::ptr::null(),
        collnetEnable: UNDEF,
        CTAPolicy: UNDEF,
        shrinkShare: UNDEF,
        nvlsCTAs: UNDEF,
        nChannelsPerNetPeer: UNDEF,
        nvlinkCentricSched: UNDEF,
        graphUsageMode: UNDEF,
        numRmaCtx: UNDEF,
        maxP2pPeers: UNDEF,
    })
}

/// Where a communicator's pending work stands: `ncclCommGetAsyncError`.
///
/// # Safety
/// `raw` must be a live (not aborted) communicator.
unsafe fn async_progress(raw: sys::ncclComm_t, op: &'static str) -> Progress {
    let mut result = sys::ncclResult_t::ncclSuccess;
    // SAFETY: the caller's.
    let status = unsafe { sys::ncclCommGetAsyncError(raw, &mut result) };
    match (status, result) {
        (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclSuccess) => Progress::Done,
        (sys::ncclResult_t::ncclSuccess, sys::ncclResult_t::ncclInProgress) => Progress::Pending,
        (sys::ncclResult_t::ncclSuccess, error) | (error, _) => Progress::Failed(nccl_error(op, error)),
    }
}

/// Bytes of an NCCL unique id.
pub const ID_BYTES: usize = 128;

/// How often the watchdog polls a pending collective.
const POLL: Duration = Duration::from_micros(200);

/// An NCCL failure of `op` with its result code and NCCL's own last error text (cudarc's
/// `NcclError` prints only its type name).
fn nccl_error(op: &'static str, result: sys::ncclResult_t) -> CollectiveError {
    // SAFETY: ncclGetLastError reads NCCL's last-error buffer (it ignores the communicator,
    // which may be null) and returns a NUL-terminated string that stays valid until the next
    // NCCL call on this thread; it is copied at once.
    let text = unsafe {
        let raw = sys::ncclGetLastError(std::ptr::null_mut());
        if raw.is_null() { String::new() } else { std::ffi::CStr::from_ptr(raw).to_string_lossy().trim().to_owned() }
    };
    CollectiveError::Nccl { op, code: result as u32, result: format!("{result:?}"), last_error: text }
}

/// [`nccl_error`] for one of cudarc's wrapped calls.
fn nccl_err(op: &'static str) -> impl Fn(nccl::NcclError) -> CollectiveError {
    move |e| nccl_error(op, e.0)
}

fn cuda_err(e: driver::DriverError) -> CollectiveError {
    CollectiveError::Driver(e)
}

/// A fresh NCCL unique id (rank 0 creates one per generation and publishes it).
pub fn new_id() -> Result<Vec<u8>, CollectiveError> {
    let id = nccl::get_uniqueid().map_err(nccl_err("get-unique-id"))?;
    Ok(id.internal.iter().map(|&c| c as u8).collect())
}

struct Comm {
    raw: sys::ncclComm_t,
}

// SAFETY: an ncclComm_t may be used from any thread; every use goes through the Mutex.
unsafe impl Send for Comm {}

/// The staging buffers, reused by every collective of a communicator.
#[derive(Default)]
struct Buffers {
    /// Page-locked (not write-combined: the host reads the results back), so copies are DMA.
    host: Option<PinnedHostSlice<u8>>,
    device: Option<CudaSlice<u8>>,
    /// Bytes each holds.
    capacity: usize,
}

/// One rank's communicator.
pub struct NcclGroup {
    comm: Mutex<Comm>,
    buffers: Mutex<Buffers>,
    aborted: AtomicBool,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    rank: usize,
    world_size: usize,
    timeout: Duration,
}

/// Element types the group moves.
pub trait Element: DeviceRepr + bytemuck::Pod + Send + 'static {
    /// NCCL's name for the type.
    const NCCL: sys::ncclDataType_t;
}

impl Element for f32 {
    const NCCL: sys::ncclDataType_t = sys::ncclDataType_t::ncclFloat32;
}

impl Element for u32 {
    const NCCL: sys::ncclDataType_t = sys::ncclDataType_t::ncclUint32;
}

impl NcclGroup {
    /// Joins the communicator of `id` as `rank` of `world_size` on CUDA device `ordinal`,
    /// waiting until every rank has joined, `timeout` passes or `cancel` is set (the half-made
    /// communicator is then aborted, so nothing is left running).
    pub fn join(
        ordinal: usize,
        (rank, world_size): (usize, usize),
        id: &[u8],
        timeout: Duration,
        cancel: &AtomicBool,
    ) -> Result<Self, CollectiveError> {
        let bytes: [u8; ID_BYTES] = id.try_into().map_err(|_| CollectiveError::IdLength { len: id.len() })?;
        let id = sys::ncclUniqueId { internal: bytes.map(|b| b as ::core::ffi::c_char) };
        let ctx = CudaContext::new(ordinal).map_err(cuda_err)?;
        let stream = ctx.new_stream().map_err(cuda_err)?;
        let mut config = nonblocking_config()?;
        // NCCL_COMM_BLOCKING=1 overrides `blocking = 0`: the init and every enqueue would then
        // block inside NCCL, out of the watchdog's reach.
        if std::env::var("NCCL_COMM_BLOCKING").is_ok_and(|v| v.trim() != "0") {
            return Err(CollectiveError::BlockingForced);
        }
        let mut raw: sys::ncclComm_t = std::ptr::null_mut();
        let (n, r) = (world_size as i32, rank as i32);
        // SAFETY: NCCL writes `raw` (on success and on ncclInProgress alike, and possibly before
        // a later error); the id is 128 valid bytes; `config` outlives the call.
        if let Err(e) = unsafe { nccl::comm_init_rank_config(&mut raw, n, id, r, &mut config) } {
            if !raw.is_null() {
                // SAFETY: a handle NCCL returned, used by no other thread.
                let _ = unsafe { nccl::comm_abort(raw) };
            }
            return Err(nccl_error("init", e.0));
        }
        let watch = Watch { op: "init", deadline: Instant::now() + timeout, timeout, interval: POLL, aborted: cancel };
        // SAFETY: `raw` is live until aborted below.
        if let Err(e) = settle(&watch, || unsafe { async_progress(raw, "init") }) {
            tracing::error!(rank, world_size, error = %e, "nccl init did not settle; communicator aborted");
            // SAFETY: `raw` is live and no other thread has it.
            let _ = unsafe { nccl::comm_abort(raw) };
            return Err(e);
        }
        Ok(Self {
            comm: Mutex::new(Comm { raw }),
            buffers: Mutex::new(Buffers::default()),
            aborted: AtomicBool::new(false),
            ctx,
            stream,
            rank,
            world_size,
            timeout,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the group.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    fn lock(&self) -> MutexGuard<'_, Comm> {
        self.comm.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Aborts the communicator (idempotent; safe while another thread waits on it).
    pub fn abort(&self) {
        let comm = self.lock();
        if !self.aborted.swap(true, Ordering::SeqCst) {
            // SAFETY: the communicator is live (not yet aborted); holders of the lock only make
            // non-blocking calls, so taking it never waits on NCCL.
            if let Err(e) = unsafe { nccl::comm_abort(comm.raw) } {
                tracing::warn!(rank = self.rank, error = ?e, "ncclCommAbort failed");
            }
        }
    }

    /// Sums `values` over every rank in place (blocking, under the watchdog).
    pub fn all_reduce_sum<T: Element>(&self, values: &mut [T]) -> Result<(), CollectiveError> {
        self.run(values, Op::Sum, "all-reduce")
    }

    /// Replaces `values` with rank 0's (blocking, under the watchdog).
    pub fn broadcast<T: Element>(&self, values: &mut [T]) -> Result<(), CollectiveError> {
        self.run(values, Op::FromRankZero, "broadcast")
    }

    fn run<T: Element>(&self, values: &mut [T], op: Op, name: &'static str) -> Result<(), CollectiveError> {
        self.ctx.bind_to_thread().map_err(cuda_err)?;
        let transfers = Transfers::of(op, self.rank);
        let bytes = std::mem::size_of_val(values);
        if bytes == 0 {
            return Ok(());
        }
        // Checked before the upload too: an aborted group returns before any copy is in flight
        // (an upload left running would still read the pinned buffer the next call writes).
        if self.aborted.load(Ordering::SeqCst) {
            return Err(CollectiveError::Aborted);
        }
        let mut buffers = self.buffers.lock().unwrap_or_else(|p| p.into_inner());
        let (host, device) = self.staged(&mut buffers, bytes)?;
        let (host, mut device) = (&mut host[..bytes], device.slice_mut(..bytes));
        if transfers.upload {
            host.copy_from_slice(bytemuck::cast_slice(values));
            self.stream.memcpy_htod(&*host, &mut device).map_err(cuda_err)?;
        }
        let deadline = Instant::now() + self.timeout;
        {
            let comm = self.lock();
            if self.aborted.load(Ordering::SeqCst) {
                return Err(CollectiveError::Aborted);
            }
            let (ptr, _sync) = device.device_ptr_mut(&self.stream);
            let (ptr, stream) = (ptr as *mut ::core::ffi::c_void, self.stream.cu_stream() as sys::cudaStream_t);
            // SAFETY: `ptr` holds `values.len()` elements of T on this communicator's device,
            // and stays alive until the stream has completed (we wait below).
            let enqueued = unsafe {
                match op {
                    Op::Sum => {
                        nccl::all_reduce(ptr, ptr, values.len(), T::NCCL, sys::ncclRedOp_t::ncclSum, comm.raw, stream)
                    }
                    Op::FromRankZero => nccl::broadcast(ptr, ptr, values.len(), T::NCCL, 0, comm.raw, stream),
                }
            };
            if let Err(e) = enqueued {
                drop(comm);
                // A refused enqueue leaves a non-blocking communicator in an error state.
                self.abort();
                return Err(nccl_error(name, e.0));
            }
        }
        // A non-blocking enqueue may still be connecting to its peers: its kernel is on the
        // stream only once the communicator's pending work settles. The wait also covers the
        // upload, which ran before it on the same stream.
        self.settle(name, deadline, || self.progress(name))?;
        self.wait(name, deadline)?;
        if transfers.download {
            self.stream.memcpy_dtoh(&device, &mut *host).map_err(cuda_err)?;
            self.stream.synchronize().map_err(cuda_err)?;
            bytemuck::cast_slice_mut(values).copy_from_slice(host);
        }
        Ok(())
    }

    /// The staging buffers, grown to hold `bytes` when they do not (the old ones are freed
    /// first: at P = 190M two of each would not be small).
    fn staged<'b>(
        &self,
        buffers: &'b mut Buffers,
        bytes: usize,
    ) -> Result<(&'b mut [u8], &'b mut CudaSlice<u8>), CollectiveError> {
        if let Some(capacity) = grown(buffers.capacity, bytes) {
            (buffers.host, buffers.device, buffers.capacity) = (None, None, 0);
            // SAFETY: the memory is uninitialised until written; every collective writes the
            // bytes it reads (an upload, or NCCL's result before a download).
            let host = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(capacity, 0) }.map_err(cuda_err)?;
            // SAFETY: as above, for the device buffer.
            let device = unsafe { self.stream.alloc::<u8>(capacity) }.map_err(cuda_err)?;
            (buffers.host, buffers.device, buffers.capacity) = (Some(host), Some(device), capacity);
        }
        let (Some(host), Some(device)) = (&mut buffers.host, &mut buffers.device) else {
            return Err(CollectiveError::Cuda(format!("no staging buffers for a collective of {bytes} bytes")));
        };
        Ok((host.as_mut_slice().map_err(cuda_err)?, device))
    }

    /// [`settle`] under this group's abort flag; the communicator is aborted on any failure.
    fn settle(
        &self,
        op: &'static str,
        deadline: Instant,
        poll: impl FnMut() -> Progress,
    ) -> Result<(), CollectiveError> {
        let watch = Watch { op, deadline, timeout: self.timeout, interval: POLL, aborted: &self.aborted };
        let result = settle(&watch, poll);
        match &result {
            Err(CollectiveError::Aborted) | Ok(()) => {}
            Err(e) => {
                tracing::error!(rank = self.rank, op, error = %e, "collective watchdog fired");
                self.abort();
            }
        }
        result
    }

    /// Polls the stream's completion (and the communicator's errors) until the deadline.
    fn wait(&self, op: &'static str, deadline: Instant) -> Result<(), CollectiveError> {
        let event = self.ctx.new_event(None).map_err(cuda_err)?;
        event.record(&self.stream).map_err(cuda_err)?;
        self.settle(op, deadline, || {
            // SAFETY: the event is live for this call.
            match unsafe { driver::event::query(event.cu_event()) } {
                Ok(()) => Progress::Done,
                Err(driver::DriverError(cudarc::driver::sys::cudaError_enum::CUDA_ERROR_NOT_READY)) => {
                    match self.progress(op) {
                        Progress::Done => Progress::Pending,
                        other => other,
                    }
                }
                Err(e) => Progress::Failed(cuda_err(e)),
            }
        })
    }

    /// The communicator's pending work, under the lock (an aborted one reports the abort).
    fn progress(&self, op: &'static str) -> Progress {
        let comm = self.lock();
        if self.aborted.load(Ordering::SeqCst) {
            return Progress::Failed(CollectiveError::Aborted);
        }
        // SAFETY: the communicator is live while `aborted` is false under the lock.
        unsafe { async_progress(comm.raw, op) }
    }
}
/// Aborts the group if dropped while armed: a session dropped mid-collective (its group was
/// re-formed) must not leave the blocking thread waiting forever.
struct AbortOnDrop(Option<Arc<NcclGroup>>);

/// Sets its flag when dropped: an init still polling sees it and aborts.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(group) = self.0.take() {
            group.abort();
        }
    }
}

impl NcclGroup {
    /// [`NcclGroup::join`] on a blocking thread. The join bounds itself by `timeout` and aborts
    /// what it made, so its thread always returns; dropping this future (the group re-forms)
    /// cancels the join at its next poll instead of leaving it to wait out the timeout.
    pub async fn join_async(
        ordinal: usize,
        ranks: (usize, usize),
        id: Vec<u8>,
        timeout: Duration,
    ) -> Result<Arc<Self>, CollectiveError> {
        let cancel = CancelOnDrop(Arc::new(AtomicBool::new(false)));
        let flag = cancel.0.clone();
        let joining = tokio::task::spawn_blocking(move || Self::join(ordinal, ranks, &id, timeout, &flag));
        match joining.await {
            Ok(result) => result.map(Arc::new),
            Err(source) => Err(CollectiveError::Thread { op: "init", source }),
        }
    }

    /// Runs `op` on a blocking thread; the communicator is aborted if this future is dropped
    /// before it completes.
    async fn blocking<T: Element>(
        self: &Arc<Self>,
        mut values: Vec<T>,
        op: fn(&Self, &mut [T]) -> Result<(), CollectiveError>,
    ) -> Result<Vec<T>, CollectiveError> {
        let mut guard = AbortOnDrop(Some(self.clone()));
        let group = self.clone();
        let result = tokio::task::spawn_blocking(move || op(&group, &mut values).map(|()| values)).await;
        guard.0 = None;
        result.map_err(|source| CollectiveError::Thread { op: "collective", source })?
    }

    /// [`NcclGroup::all_reduce_sum`] of an owned buffer, off the async runtime.
    pub async fn sum(self: &Arc<Self>, values: Vec<f32>) -> Result<Vec<f32>, CollectiveError> {
        self.blocking(values, Self::all_reduce_sum).await
    }

    /// [`NcclGroup::broadcast`] of an owned buffer, off the async runtime.
    pub async fn from_rank_zero<T: Element>(self: &Arc<Self>, values: Vec<T>) -> Result<Vec<T>, CollectiveError> {
        self.blocking(values, Self::broadcast).await
    }
}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        self.abort();
    }
}
