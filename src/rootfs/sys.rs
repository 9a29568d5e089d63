//! The new mount API (open_tree, move_mount, mount_setattr, fsopen/fsmount) and the few
//! *at calls the injector needs, as thin safe wrappers over raw syscalls.
//!
//! Mounts are made onto file descriptors, never onto path strings that could be swapped
//! between a check and the mount (the lesson of CVE-2024-0132).

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn cstr(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput.into())
}

fn fd_result(rc: libc::c_long) -> io::Result<OwnedFd> {
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as i32) })
}

fn unit_result(rc: libc::c_long) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A detached copy of the mount at `path` (a bind mount not yet attached anywhere).
pub fn clone_tree(path: &Path, recursive: bool) -> io::Result<OwnedFd> {
    let p = cstr(path)?;
    let flags = clone_flags(recursive);
    // SAFETY: p is a valid NUL-terminated string for the duration of the call.
    fd_result(unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, p.as_ptr(), flags) })
}

/// `open_tree_attr` (Linux 6.15), numbered alike on every architecture since the mount API.
const SYS_OPEN_TREE_ATTR: libc::c_long = 467;

/// Cleared once `open_tree_attr` has been refused, so that each later clone makes one call, not
/// a failed one first.
static OPEN_TREE_ATTR: AtomicBool = AtomicBool::new(true);

/// [`clone_tree`] with `attrs` set on the copy and the copy made private, as [`set_attrs`] sets
/// them: in the one call the kernel's `open_tree_attr` makes of it, or in the two where the
/// kernel is older (ENOSYS) or a seccomp profile that predates the call refuses it (EPERM; a
/// process that may not clone at all gets its EPERM from the clone then).
pub fn clone_tree_with(path: &Path, recursive: bool, attrs: u64) -> io::Result<OwnedFd> {
    if OPEN_TREE_ATTR.load(Ordering::Relaxed) {
        let p = cstr(path)?;
        let attr = private_with(attrs);
        // SAFETY: p is a valid NUL-terminated string and attr a valid struct for the call.
        let rc = unsafe {
            libc::syscall(
                SYS_OPEN_TREE_ATTR,
                libc::AT_FDCWD,
                p.as_ptr(),
                clone_flags(recursive),
                &attr as *const MountAttr,
                std::mem::size_of::<MountAttr>(),
            )
        };
        match fd_result(rc) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
                OPEN_TREE_ATTR.store(false, Ordering::Relaxed);
            }
            cloned => return cloned,
        }
    }
    let tree = clone_tree(path, recursive)?;
    set_attrs(tree.as_fd(), attrs)?;
    Ok(tree)
}

fn clone_flags(recursive: bool) -> libc::c_uint {
    OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | if recursive { AT_RECURSIVE } else { 0 }
}

fn private_with(attrs: u64) -> MountAttr {
    MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: libc::MS_PRIVATE,
        userns_fd: 0,
    }
}

/// A detached bind of `name` in the directory `dir` (its mount must be attached: older kernels
/// clone nothing out of a detached tree).
pub fn clone_at(dir: BorrowedFd, name: &CStr) -> io::Result<OwnedFd> {
    let flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    // SAFETY: dir is a valid descriptor and name a NUL-terminated string for the call.
    fd_result(unsafe { libc::syscall(libc::SYS_open_tree, dir.as_raw_fd(), name.as_ptr(), flags) })
}

/// Lazily unmounts the mount at `path` (with every mount under it).
pub fn unmount_lazily(path: &Path) -> io::Result<()> {
    let p = cstr(path)?;
    // SAFETY: p is a valid NUL-terminated string for the call.
    unit_result(unsafe { libc::umount2(p.as_ptr(), libc::MNT_DETACH) }.into())
}

/// Lazily unmounts the mount whose root `root` refers to.
pub fn detach(root: BorrowedFd) -> io::Result<()> {
    let path = CString::new(format!("/proc/self/fd/{}", root.as_raw_fd()))
        .map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: path is a valid NUL-terminated string for the call.
    unit_result(unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) }.into())
}

/// Sets mount attributes on a whole detached tree and makes it private, so that nothing
/// mounted under it later propagates anywhere.
pub fn set_attrs(tree: BorrowedFd, attrs: u64) -> io::Result<()> {
    let attr = private_with(attrs);
    // SAFETY: the empty path with AT_EMPTY_PATH refers to `tree`; attr is a valid struct.
    unit_result(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            (libc::AT_EMPTY_PATH as libc::c_uint) | AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
}

/// Attaches a detached tree on top of the inode `target` refers to.
pub fn attach(tree: BorrowedFd, target: BorrowedFd) -> io::Result<()> {
    // SAFETY: both descriptors are valid for the call; empty paths with *_EMPTY_PATH flags.
    unit_result(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    })
}

/// A new, detached tmpfs (nosuid, nodev, noexec) whose root has `mode` (octal, `c"0555"`).
pub fn new_tmpfs(mode: &CStr) -> io::Result<OwnedFd> {
    // SAFETY: static NUL-terminated strings; the returned fds are owned below.
    let ctx =
        fd_result(unsafe { libc::syscall(libc::SYS_fsopen, c"tmpfs".as_ptr(), FSOPEN_CLOEXEC) })?;
    // SAFETY: ctx is a valid fs context; the key and value are NUL-terminated.
    unit_result(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            ctx.as_raw_fd(),
            FSCONFIG_SET_STRING,
            c"mode".as_ptr(),
            mode.as_ptr(),
            0,
        )
    })?;
    // SAFETY: as above, with no key or value for CMD_CREATE.
    unit_result(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            ctx.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_char>(),
            0,
        )
    })?;
    // SAFETY: ctx is a created fs context.
    fd_result(unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            ctx.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
        )
    })
}

/// fstat of any descriptor (O_PATH included).
pub fn fstat(fd: BorrowedFd) -> io::Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: st is a valid out-pointer; the empty path with AT_EMPTY_PATH names fd itself.
    let rc = unsafe {
        libc::fstatat(
            fd.as_raw_fd(),
            c"".as_ptr(),
            st.as_mut_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatat succeeded and filled st.
    Ok(unsafe { st.assume_init() })
}

/// lstat of `name` in `dir`; Ok(None) when absent.
pub fn lstat_at(dir: BorrowedFd, name: &CStr) -> io::Result<Option<libc::stat>> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: name is NUL-terminated, st a valid out-pointer.
    let rc = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::NotFound {
            Ok(None)
        } else {
            Err(e)
        };
    }
    // SAFETY: fstatat succeeded and filled st.
    Ok(Some(unsafe { st.assume_init() }))
}

/// openat relative to `dir`, never following a final symlink.
pub fn open_at(dir: BorrowedFd, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: name is NUL-terminated; the result is owned below.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            flags | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            mode as libc::c_uint,
        )
    };
    fd_result(fd as libc::c_long)
}

pub fn mknod_at(dir: BorrowedFd, name: &CStr, mode: u32, major: u32, minor: u32) -> io::Result<()> {
    // SAFETY: name is NUL-terminated.
    let rc = unsafe {
        libc::mknodat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::S_IFCHR | mode,
            libc::makedev(major, minor),
        )
    };
    unit_result(rc as libc::c_long)
}

pub fn symlink_at(target: &CStr, dir: BorrowedFd, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated.
    let rc = unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) };
    unit_result(rc as libc::c_long)
}

pub fn readlink_at(dir: BorrowedFd, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: buf is writable for its length; name is NUL-terminated.
    let n = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

pub fn unlink_at(dir: BorrowedFd, name: &CStr) -> io::Result<()> {
    // SAFETY: name is NUL-terminated.
    unit_result(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) } as libc::c_long)
}

pub fn rename_at(dir: BorrowedFd, from: &CStr, to: &CStr) -> io::Result<()> {
    // SAFETY: both names are NUL-terminated; the same directory fd is used for both.
    let rc =
        unsafe { libc::renameat(dir.as_raw_fd(), from.as_ptr(), dir.as_raw_fd(), to.as_ptr()) };
    unit_result(rc as libc::c_long)
}

pub fn mkdir_at(dir: BorrowedFd, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: name is NUL-terminated.
    unit_result(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) } as libc::c_long)
}

/// The names in the directory `dir` (an O_PATH handle will do), without `.` and `..`; an
/// error past `limit` names, so a hostile directory cannot make the caller list it forever.
pub fn dir_names(dir: BorrowedFd, limit: usize) -> io::Result<Vec<CString>> {
    use std::os::fd::IntoRawFd;
    let fd = open_at(dir, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0)?;
    // SAFETY: fdopendir takes ownership of a valid directory descriptor (closed by closedir).
    let stream = unsafe { libc::fdopendir(fd.into_raw_fd()) };
    if stream.is_null() {
        return Err(io::Error::last_os_error());
    }
    let mut names = Vec::new();
    let result = loop {
        // SAFETY: stream is a valid DIR*; the entry it returns lives until the next call.
        let entry = unsafe { libc::readdir64(stream) };
        if entry.is_null() {
            break Ok(());
        }
        // SAFETY: d_name is NUL-terminated within the entry.
        let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) };
        if name == c"." || name == c".." {
            continue;
        }
        if names.len() == limit {
            break Err(io::Error::other(format!("more than {limit} entries")));
        }
        names.push(name.to_owned());
    };
    // SAFETY: stream is valid and not used after.
    unsafe { libc::closedir(stream) };
    result.map(|()| names)
}

/// The inode `fd` (an O_PATH descriptor) refers to, opened again with `flags` through
/// /proc/thread-self/fd/N: the kernel follows the descriptor itself, so no path is resolved
/// again. The /proc found must be procfs and the root of its mount; the file opened must be
/// `st`'s inode. Callers run where /proc is the host's (nvhook-runtime, or a hook before
/// pivot_root, whose mount namespace only the runtime has changed).
pub fn reopen_through_proc(fd: BorrowedFd, st: &libc::stat, flags: i32) -> io::Result<OwnedFd> {
    let proc = fd_result(
        // SAFETY: a NUL-terminated literal; the result is owned.
        unsafe {
            libc::open(
                c"/proc".as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        } as libc::c_long,
    )?;
    let mut fs = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: fs is a valid out-pointer for the call.
    unit_result(unsafe { libc::fstatfs(proc.as_raw_fd(), fs.as_mut_ptr()) } as libc::c_long)?;
    // SAFETY: fstatfs succeeded and filled fs.
    if unsafe { fs.assume_init() }.f_type != libc::PROC_SUPER_MAGIC {
        return Err(io::Error::other("/proc is not procfs"));
    }
    if !is_mount_root(proc.as_fd())? {
        return Err(io::Error::other("/proc is not the root of a procfs mount"));
    }
    let link = CString::new(format!("thread-self/fd/{}", fd.as_raw_fd()))
        .map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: link is NUL-terminated; the result is owned below.
    let file = fd_result(unsafe {
        libc::openat(
            proc.as_raw_fd(),
            link.as_ptr(),
            flags | libc::O_CLOEXEC | libc::O_NOCTTY,
        )
    } as libc::c_long)?;
    let again = fstat(file.as_fd())?;
    if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) {
        return Err(io::Error::other("reopened a different file"));
    }
    Ok(file)
}

fn statx(fd: BorrowedFd, mask: libc::c_uint) -> io::Result<libc::statx> {
    let mut stx = std::mem::MaybeUninit::<libc::statx>::uninit();
    // SAFETY: the empty path with AT_EMPTY_PATH names fd; stx is a valid out-pointer.
    unit_result(unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
            mask,
            stx.as_mut_ptr(),
        )
    } as libc::c_long)?;
    // SAFETY: statx succeeded and filled stx.
    Ok(unsafe { stx.assume_init() })
}

/// Whether `fd` is the root of a mount (statx, Linux 5.8+; false where the kernel cannot say).
pub fn is_mount_root(fd: BorrowedFd) -> io::Result<bool> {
    let stx = statx(fd, 0)?;
    let known = stx.stx_attributes_mask & libc::STATX_ATTR_MOUNT_ROOT as u64 != 0;
    Ok(known && stx.stx_attributes & libc::STATX_ATTR_MOUNT_ROOT as u64 != 0)
}

/// The id of the mount `fd` is on, as /proc/self/mountinfo numbers mounts.
pub fn mount_id(fd: BorrowedFd) -> io::Result<u64> {
    let stx = statx(fd, libc::STATX_MNT_ID)?;
    if stx.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(io::Error::other(
            "the kernel gives no mount id (statx, Linux 5.8+)",
        ));
    }
    Ok(stx.stx_mnt_id)
}

/// Makes this thread's filesystem ids (those the kernel checks and gives new files) `uid`
/// and `gid`. setfsuid(2) reports no error: the ids are read back to tell.
pub fn set_fs_ids(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: setfsgid and setfsuid take plain integers and touch no memory.
    unsafe {
        libc::setfsgid(gid);
        libc::setfsuid(uid);
        // With an id that cannot be valid, each returns the current one and changes nothing.
        if libc::setfsgid(u32::MAX) as u32 != gid || libc::setfsuid(u32::MAX) as u32 != uid {
            return Err(io::Error::from(io::ErrorKind::PermissionDenied));
        }
    }
    Ok(())
}

/// Enters the mount namespace of `pid`.
///
/// setns(CLONE_NEWNS) refuses a thread whose filesystem context (root, cwd) other threads
/// share. nvhook starts none, but it may not be alone: qemu-user, which runs an aarch64 hook
/// on an x86_64 machine (and the other way round), keeps a thread of its own in every process
/// it runs. Unsharing the context first makes it this thread's alone, and changes nothing for
/// a single-threaded process.
pub fn enter_mount_ns(ns: &impl AsFd) -> io::Result<()> {
    use nix::sched::CloneFlags;
    nix::sched::unshare(CloneFlags::CLONE_FS).map_err(io::Error::from)?;
    nix::sched::setns(ns, CloneFlags::CLONE_NEWNS).map_err(io::Error::from)
}

pub fn file_type(st: &libc::stat) -> libc::mode_t {
    st.st_mode & libc::S_IFMT
}
