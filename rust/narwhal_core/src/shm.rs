//! A fixed-size memory region (private, or a shared file in `/dev/shm`) with a checked header and a cross-process spinlock.
//!
//! Layout: a 64-byte [`Header`] (magic, layout version, total size, engine count, the
//! lock word, a steal counter) followed by the caller's body at [`BODY_OFFSET`]. The
//! region only ever holds atomics, so every process maps it read-write and updates it
//! in place. A file is created under a temporary name, initialised, then renamed into
//! place, so a process attaching never sees a half-written header.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use memmap2::MmapMut;
use thiserror::Error;

/// "NRWHLBRD", the first eight bytes of every board file.
pub const MAGIC: u64 = u64::from_le_bytes(*b"NRWHLBRD");
/// Where the body starts (one cache line after the header's start).
pub const BODY_OFFSET: usize = 64;
/// How long a waiter lets a lock holder keep the lock before checking that it still lives.
const STEAL_AFTER: Duration = Duration::from_secs(1);

/// Why a region could not be created or attached.
#[derive(Debug, Error)]
pub enum ShmError {
    #[error("board file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("board file {path} is not a Narwhal board (bad magic)")]
    BadMagic { path: PathBuf },
    #[error("board file {path} has layout version {found}, this build expects {expected}")]
    Version {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("board file {path} holds {found} engines, this process expects {expected}")]
    Engines {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("board file {path} is {found} bytes, its layout needs {expected}")]
    Size {
        path: PathBuf,
        found: u64,
        expected: u64,
    },
}

/// The region's first 64 bytes; every field is atomic because other processes map it too.
#[repr(C)]
struct Header {
    magic: AtomicU64,
    size: AtomicU64,
    version: AtomicU32,
    engines: AtomicU32,
    /// 0 when free, else the holder's process id.
    lock: AtomicU32,
    _pad: AtomicU32,
    /// Locks taken over from a dead holder (a worker killed inside a critical section).
    steals: AtomicU64,
}

const _: () = assert!(std::mem::size_of::<Header>() <= BODY_OFFSET);

/// A mapped region: header plus body. Cloning is not offered; share it behind an `Arc`.
pub struct Region {
    base: NonNull<u8>,
    len: usize,
    pid: u32,
    path: Option<PathBuf>,
    _map: MmapMut,
}

// SAFETY: the mapping lives as long as `Region` (`_map`), is never unmapped or resized
// while borrowed, and the memory behind `base` is only accessed through atomics.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

/// Held while the region's lock is held; unlocks on drop.
pub struct LockGuard<'a> {
    word: &'a AtomicU32,
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        self.word.store(0, Ordering::Release);
    }
}

impl Region {
    /// A zeroed region private to this process (anonymous memory).
    pub fn private(body_len: usize, version: u32, engines: u32) -> Region {
        let len = BODY_OFFSET + body_len;
        let map = MmapMut::map_anon(len).expect("anonymous mmap of a few kilobytes");
        let region = Region::from_map(map, None);
        region.init_header(version, engines);
        region
    }

    /// Creates (or replaces) the shared file at `path`, zeroed, with a fresh header.
    pub fn create(
        path: &Path,
        body_len: usize,
        version: u32,
        engines: u32,
    ) -> Result<Region, ShmError> {
        let io_err = |source| ShmError::Io {
            path: path.to_path_buf(),
            source,
        };
        let len = BODY_OFFSET + body_len;
        let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        match fs::remove_file(&tmp) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(e)),
            _ => {}
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err)?;
        let mapped = file.set_len(len as u64).and_then(|()| map_file(&file));
        let map = match mapped {
            Ok(map) => map,
            Err(e) => {
                let _ = fs::remove_file(&tmp);
                return Err(io_err(e));
            }
        };
        let region = Region::from_map(map, Some(path.to_path_buf()));
        region.init_header(version, engines);
        if let Err(e) = fs::rename(&tmp, path) {
            let _ = fs::remove_file(&tmp);
            return Err(io_err(e));
        }
        Ok(region)
    }

    /// Maps an existing shared file and checks its header against this build's layout.
    pub fn attach(
        path: &Path,
        body_len: usize,
        version: u32,
        engines: u32,
    ) -> Result<Region, ShmError> {
        let path_buf = path.to_path_buf();
        let io_err = |source| ShmError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io_err)?;
        let found = file.metadata().map_err(io_err)?.len();
        if found < BODY_OFFSET as u64 {
            return Err(ShmError::BadMagic { path: path_buf });
        }
        let region = Region::from_map(map_file(&file).map_err(io_err)?, Some(path_buf.clone()));
        let header = region.header();
        if header.magic.load(Ordering::Acquire) != MAGIC {
            return Err(ShmError::BadMagic { path: path_buf });
        }
        let found_version = header.version.load(Ordering::Relaxed);
        if found_version != version {
            return Err(ShmError::Version {
                path: path_buf,
                found: found_version,
                expected: version,
            });
        }
        let found_engines = header.engines.load(Ordering::Relaxed);
        if found_engines != engines {
            return Err(ShmError::Engines {
                path: path_buf,
                found: found_engines,
                expected: engines,
            });
        }
        let expected = (BODY_OFFSET + body_len) as u64;
        let declared = header.size.load(Ordering::Relaxed);
        for size in [found, declared] {
            if size != expected {
                return Err(ShmError::Size {
                    path: path_buf,
                    found: size,
                    expected,
                });
            }
        }
        Ok(region)
    }

    fn from_map(mut map: MmapMut, path: Option<PathBuf>) -> Region {
        let len = map.len();
        let base = NonNull::new(map.as_mut_ptr()).expect("mmap never returns null");
        Region {
            base,
            len,
            pid: std::process::id(),
            path,
            _map: map,
        }
    }

    fn init_header(&self, version: u32, engines: u32) {
        let header = self.header();
        header.size.store(self.len as u64, Ordering::Relaxed);
        header.version.store(version, Ordering::Relaxed);
        header.engines.store(engines, Ordering::Relaxed);
        header.magic.store(MAGIC, Ordering::Release);
    }

    fn header(&self) -> &Header {
        // SAFETY: the region is at least BODY_OFFSET bytes, page-aligned, and Header is
        // made of atomics (valid for any bit pattern, interior-mutable).
        unsafe { &*(self.base.as_ptr() as *const Header) }
    }

    /// The body's first byte (page-aligned + 64, so aligned for any atomic).
    pub fn body(&self) -> NonNull<u8> {
        // SAFETY: BODY_OFFSET < len (checked at creation/attach).
        unsafe { self.base.add(BODY_OFFSET) }
    }

    /// The body's length in bytes.
    pub fn body_len(&self) -> usize {
        self.len - BODY_OFFSET
    }

    /// The shared file's path, or `None` for a private region.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The process id this mapping acts for (cached when mapped).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Locks taken over from dead holders since the region was created.
    pub fn steals(&self) -> u64 {
        self.header().steals.load(Ordering::Relaxed)
    }

    /// Takes the region's lock (spin, then yield). Critical sections are a handful of
    /// atomic adds; a holder that died inside one (its process gone for over a second)
    /// has its lock taken over and counted in [`Region::steals`].
    pub fn lock(&self) -> LockGuard<'_> {
        let word = &self.header().lock;
        let me = self.pid;
        let mut spins: u32 = 0;
        let mut waiting_since: Option<Instant> = None;
        loop {
            if word
                .compare_exchange_weak(0, me, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return LockGuard { word };
            }
            spins = spins.wrapping_add(1);
            if spins < 64 {
                std::hint::spin_loop();
                continue;
            }
            std::thread::yield_now();
            if !spins.is_multiple_of(256) {
                continue;
            }
            let since = *waiting_since.get_or_insert_with(Instant::now);
            if since.elapsed() < STEAL_AFTER {
                continue;
            }
            let holder = word.load(Ordering::Relaxed);
            if holder != 0 && holder != me && !process_alive(holder) {
                let taken = word
                    .compare_exchange(holder, me, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok();
                if taken {
                    self.header().steals.fetch_add(1, Ordering::Relaxed);
                    return LockGuard { word };
                }
            }
            waiting_since = Some(Instant::now());
        }
    }

    /// Removes the shared file (the region stays mapped until dropped). No-op when private
    /// or already removed.
    pub fn unlink(&self) -> Result<(), ShmError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        match fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(ShmError::Io {
                path: path.clone(),
                source: e,
            }),
            _ => Ok(()),
        }
    }
}

fn map_file(file: &File) -> io::Result<MmapMut> {
    // SAFETY: the file is ours (0600, created or attached by the router's own processes)
    // and only ever accessed through atomics; truncation by another process is not
    // part of the protocol (replacement goes through rename, which leaves this inode).
    unsafe { MmapMut::map_mut(file) }
}

/// Whether a process still runs: it exists and is not a zombie (exited, not yet waited
/// for). Without a readable /proc, assume it does (never steal or reap on a guess).
/// Assumes every process of the board shares one pid namespace.
pub(crate) fn process_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')'; comm may hold anything.
        Ok(stat) => match stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].trim_start().chars().next())
        {
            Some(state) => !matches!(state, 'Z' | 'X' | 'x'),
            None => true,
        },
        Err(_) => !Path::new("/proc/self").exists(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// A test file path under /dev/shm, removed when dropped (also when the test panics).
    struct TempPath(PathBuf);

    impl std::ops::Deref for TempPath {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl AsRef<Path> for TempPath {
        fn as_ref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn tmp_path(name: &str) -> TempPath {
        let dir = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        TempPath(dir.join(format!("narwhal-test-{}-{}", name, std::process::id())))
    }

    fn counter(region: &Region) -> &AtomicU64 {
        // SAFETY: the body is at least 8 bytes and 8-aligned in these tests.
        unsafe { &*(region.body().as_ptr() as *const AtomicU64) }
    }

    #[test]
    fn create_attach_share_memory() {
        let path = tmp_path("share");
        let a = Region::create(&path, 64, 7, 3).unwrap();
        let b = Region::attach(&path, 64, 7, 3).unwrap();
        counter(&a).fetch_add(5, Ordering::Relaxed);
        assert_eq!(counter(&b).load(Ordering::Relaxed), 5);
        a.unlink().unwrap();
        a.unlink().unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn attach_checks_header() {
        let path = tmp_path("header");
        let a = Region::create(&path, 64, 7, 3).unwrap();
        assert!(matches!(
            Region::attach(&path, 64, 8, 3),
            Err(ShmError::Version { found: 7, .. })
        ));
        assert!(matches!(
            Region::attach(&path, 64, 7, 4),
            Err(ShmError::Engines { found: 3, .. })
        ));
        assert!(matches!(
            Region::attach(&path, 72, 7, 3),
            Err(ShmError::Size { .. })
        ));
        fs::write(&path, [0u8; 128]).unwrap();
        assert!(matches!(
            Region::attach(&path, 64, 7, 3),
            Err(ShmError::BadMagic { .. })
        ));
        fs::write(&path, [0u8; 8]).unwrap();
        assert!(matches!(
            Region::attach(&path, 64, 7, 3),
            Err(ShmError::BadMagic { .. })
        ));
        a.unlink().unwrap();
        assert!(matches!(
            Region::attach(&path, 64, 7, 3),
            Err(ShmError::Io { .. })
        ));
    }

    #[test]
    fn create_replaces_a_stale_file() {
        let path = tmp_path("stale");
        let old = Region::create(&path, 64, 7, 3).unwrap();
        counter(&old).store(9, Ordering::Relaxed);
        let new = Region::create(&path, 64, 7, 3).unwrap();
        assert_eq!(counter(&new).load(Ordering::Relaxed), 0);
        assert_eq!(
            counter(&Region::attach(&path, 64, 7, 3).unwrap()).load(Ordering::Relaxed),
            0
        );
        new.unlink().unwrap();
    }

    #[test]
    fn zombies_and_missing_processes_are_not_alive() {
        assert!(process_alive(std::process::id()));
        assert!(!process_alive(u32::MAX - 1));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        while process_alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            !process_alive(pid),
            "an exited, unwaited child is a zombie: not alive"
        );
        child.wait().unwrap();
        assert!(!process_alive(pid));
    }

    #[test]
    fn lock_from_a_dead_holder_is_taken_over() {
        let region = Region::private(64, 1, 1);
        // A pid far above pid_max cannot be alive.
        region.header().lock.store(u32::MAX - 1, Ordering::Relaxed);
        let started = Instant::now();
        drop(region.lock());
        assert!(started.elapsed() >= STEAL_AFTER);
        assert_eq!(region.steals(), 1);
        assert_eq!(region.header().lock.load(Ordering::Relaxed), 0);
    }
}
