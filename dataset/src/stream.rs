//! A rank's share of a step, streamed one micro-batch at a time: a reader task fetches and
//! decodes the next chunks (at most `prefetch` ahead of the consumer) while the trainer
//! computes on the current one. Nothing ever holds the whole share: at the paper's batch a
//! rank's share is ~164k images, ~99 GB as f32 tensors.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::Example;
use crate::JobDataError;
use crate::reader::{Dataset, View};

/// Chunks decoded ahead of the one being computed.
pub const DEFAULT_PREFETCH: usize = 2;

/// The examples of a share, in chunks of at most one micro-batch.
#[derive(Debug)]
pub struct ExampleStream {
    chunks: mpsc::Receiver<Result<Vec<Example>, JobDataError>>,
    read: Arc<AtomicUsize>,
    reader: JoinHandle<()>,
    /// Chunks in the share, and chunks handed to the consumer so far.
    expected: usize,
    handed: usize,
}

impl ExampleStream {
    /// Starts reading `indices` (global example indices) in chunks of `chunk` examples, their
    /// images prepared as `view` says.
    pub fn start(dataset: Dataset, (indices, view): (Vec<u64>, View), chunk: usize, prefetch: usize) -> Self {
        let (tx, chunks) = mpsc::channel(prefetch.max(1));
        let read = Arc::new(AtomicUsize::new(0));
        let (counter, indices_len) = (read.clone(), indices.len());
        let reader = tokio::spawn(async move {
            for part in indices.chunks(chunk.max(1)) {
                // Wait for room before reading, so at most `prefetch` chunks sit decoded.
                let Ok(permit) = tx.reserve().await else { return };
                let result = dataset.read(part.to_vec(), &view).await;
                counter.fetch_add(part.len(), Ordering::SeqCst);
                let failed = result.is_err();
                permit.send(result);
                if failed {
                    return;
                }
            }
        });
        let expected = indices_len.div_ceil(chunk.max(1));
        Self { chunks, read, reader, expected, handed: 0 }
    }

    /// The next chunk; None when the share is done. A reader that stopped before the end of
    /// the share (it panicked) is an error, never a silently smaller part.
    pub async fn next(&mut self) -> Option<Result<Vec<Example>, JobDataError>> {
        let next = self.chunks.recv().await;
        if next.is_none() && self.handed < self.expected {
            let stopped = format!("the reader stopped after {} of {} chunks", self.handed, self.expected);
            self.handed = self.expected;
            return Some(Err(JobDataError::Data(stopped)));
        }
        self.handed += usize::from(next.is_some());
        next
    }

    /// Examples read and decoded so far (consumed or waiting).
    pub fn examples_read(&self) -> usize {
        self.read.load(Ordering::SeqCst)
    }
}

impl Drop for ExampleStream {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_reader_that_stops_early_is_an_error_not_a_short_share() {
        let (tx, chunks) = mpsc::channel(2);
        tx.send(Ok(Vec::new())).await.unwrap();
        drop(tx); // the reader panicked after its first chunk of three
        let reader = tokio::spawn(async {});
        let mut stream = ExampleStream { chunks, read: Arc::default(), reader, expected: 3, handed: 0 };
        assert!(matches!(stream.next().await, Some(Ok(_))));
        let err = stream.next().await.expect("an error, not the end").unwrap_err();
        assert!(err.to_string().contains("1 of 3 chunks"), "{err}");
        assert!(stream.next().await.is_none(), "then the end");
    }
}
