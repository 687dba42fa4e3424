//! Standard output that a reader may close: `keel runs | head -1` or `keel status RUN | head -1`
//! closes the pipe after one line, and every later write fails with `EPIPE` (Rust ignores SIGPIPE,
//! so the process is not killed by it). `println!` panics on that error (exit 101 and a stack trace);
//! every line `keel` prints goes through [`lock`] or [`outln!`] instead.
//!
//! A closed stdout is not a failure of the command: the reader has all it wanted. The write reports
//! success and the rest of the output is dropped, so the command ends with the code of what it did,
//! as documented on [`Exit`](crate::exit::Exit): a read command exits 0, and a command that hosts a
//! run keeps its run's code (0, 5, or 6 for a paused run). Any other write error (a full disk under
//! `> file`) is still an error (exit 1).

use std::cell::RefCell;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::redact::ScrubbedLines;

/// Set once a write found stdout closed; later writes are dropped without trying.
static CLOSED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set while [`capture`] runs on this thread: what the command prints is kept here instead.
    static CAPTURED: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// The locked standard output, with a closed pipe read as "the reader left"; or, inside
/// [`capture`], the capture buffer of this thread. Either way every line is scrubbed of secrets
/// before it is written (issue 16; [`crate::redact`]), so the HTTP API's answers are too.
pub(crate) struct Stdout {
    inner: ScrubbedLines<Raw>,
}

/// Where [`Stdout`]'s scrubbed lines go.
pub(crate) struct Raw {
    inner: Option<io::StdoutLock<'static>>,
}

/// Locks standard output for a few lines.
pub(crate) fn lock() -> Stdout {
    let capturing = CAPTURED.with(|c| c.borrow().is_some());
    Stdout {
        inner: ScrubbedLines::new(Raw {
            inner: (!capturing).then(|| io::stdout().lock()),
        }),
    }
}

/// Run `f` with everything it prints through [`lock`] or [`outln!`] kept instead of written: the
/// HTTP API (`keel serve`) answers a read with exactly the text the command prints, so a client
/// with `--server` prints the same as a local command. Per thread: call it on the thread that
/// prints (a blocking task).
pub(crate) fn capture<T>(f: impl FnOnce() -> T) -> (T, Vec<u8>) {
    let outer = CAPTURED.with(|c| c.borrow_mut().replace(Vec::new()));
    let value = f();
    let text = CAPTURED.with(|c| std::mem::replace(&mut *c.borrow_mut(), outer));
    (value, text.unwrap_or_default())
}

/// Whether a write has found stdout closed (the reader left).
pub(crate) fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// Maps a broken pipe to success (and remembers it); every other error stays an error.
fn reader_left<T>(result: io::Result<T>, done: T) -> io::Result<T> {
    match result {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
            CLOSED.store(true, Ordering::Relaxed);
            Ok(done)
        }
        other => other,
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl Write for Raw {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let Some(inner) = self.inner.as_mut() else {
            CAPTURED.with(|c| {
                if let Some(text) = c.borrow_mut().as_mut() {
                    text.extend_from_slice(buf);
                }
            });
            return Ok(buf.len());
        };
        if closed() {
            return Ok(buf.len());
        }
        reader_left(inner.write(buf), buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let Some(inner) = self.inner.as_mut() else {
            return Ok(());
        };
        if closed() {
            return Ok(());
        }
        reader_left(inner.flush(), ())
    }
}

/// Prints one line to stdout like `println!`, but returns the write's error instead of panicking,
/// and treats a closed stdout as described in the module docs.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!($crate::stdout::lock(), $($arg)*)
    }};
}
pub(crate) use outln;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_keeps_what_is_printed_on_this_thread_and_nests() {
        let ((), outer) = capture(|| {
            let _ = outln!("one");
            let ((), inner) = capture(|| {
                let _ = outln!("two");
            });
            assert_eq!(inner, b"two\n");
            let _ = outln!("three");
        });
        assert_eq!(outer, b"one\nthree\n");
    }

    #[test]
    fn a_broken_pipe_is_the_reader_leaving_and_other_errors_stay_errors() {
        let broken = io::Error::from(io::ErrorKind::BrokenPipe);
        assert_eq!(reader_left::<usize>(Err(broken), 7).unwrap(), 7);
        assert!(closed());
        let full = io::Error::from(io::ErrorKind::StorageFull);
        assert_eq!(
            reader_left::<usize>(Err(full), 7).unwrap_err().kind(),
            io::ErrorKind::StorageFull
        );
    }
}
