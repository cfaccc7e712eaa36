//! Reading a file an operator names (the config file, a template) or one
//! found in the audit spool: it must be a regular file, and not larger
//! than its kind of file ever is.
//!
//! A FIFO put under such a name blocked its reader at `open` until a writer
//! came: a reload then waited for good, every later reload and change with
//! it, and shutdown waited for that reload. A link to `/dev/zero` filled
//! memory until the kernel killed the process.

use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// The bytes of the regular file at `path` (links followed), at most
/// `limit` of them; `InvalidInput` for anything else (a FIFO, a device, a
/// directory), `InvalidData` past `limit`.
pub fn read(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    // Non-blocking, so that opening a FIFO returns at once to be refused; a
    // regular file reads as ever.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {limit} bytes"),
        ));
    }
    Ok(bytes)
}

/// As [`read`], as UTF-8 text.
pub fn read_to_string(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read(path, limit)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_a_device_and_a_directory_are_refused_at_once() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let fifo = dir.path().join("config.toml");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        for path in [fifo.as_path(), Path::new("/dev/zero"), dir.path()] {
            let error = read(path, 1 << 20).expect_err("refused");
            assert_eq!(
                error.kind(),
                io::ErrorKind::InvalidInput,
                "{path:?}: {error}"
            );
        }
    }

    #[test]
    fn a_regular_file_reads_up_to_its_limit_and_no_further() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("sms.txt");
        std::fs::write(&path, "Your code is {code}").expect("written");
        assert_eq!(
            read_to_string(&path, 19).expect("read"),
            "Your code is {code}"
        );
        let error = read(&path, 18).expect_err("too large");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(
            error.to_string().contains("larger than 18 bytes"),
            "{error}"
        );
        std::fs::write(&path, [0xff, 0xfe]).expect("written");
        assert_eq!(
            read_to_string(&path, 19).expect_err("not UTF-8").kind(),
            io::ErrorKind::InvalidData
        );
    }
}
