//! Crossing the C boundary: out-parameters, strings, and containing panics.

use std::ffi::{CStr, c_char, c_uint};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use crate::device::Device;
use crate::handle::DeviceHandle;
use crate::state;
use crate::status::{NvmlResult, Status};
use crate::topology::Topology;

/// Runs an export's body. A panic must never unwind into C; none is expected, but
/// if one happened the caller gets `UNKNOWN`, NVML's "unexpected error".
pub fn guard(body: impl FnOnce() -> NvmlResult) -> Status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => Status::SUCCESS,
        Ok(Err(status)) => status,
        Err(_) => Status::UNKNOWN,
    }
}

/// Runs a query on an initialised library.
pub fn with_topology(query: impl FnOnce(&Topology) -> NvmlResult) -> NvmlResult {
    let topology: Arc<Topology> = state::topology()?;
    query(&topology)
}

/// Runs a query on the device a handle names.
pub fn with_device(
    raw: DeviceHandle,
    query: impl FnOnce(&Topology, Device<'_>) -> NvmlResult,
) -> NvmlResult {
    with_topology(|topology| query(topology, Device::from_handle(topology, raw)?))
}

/// Stores an out-parameter; a null pointer is the caller's invalid argument.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
pub unsafe fn write<T>(out: *mut T, value: T) -> NvmlResult {
    if out.is_null() {
        return Err(Status::INVALID_ARGUMENT);
    }
    // SAFETY: non-null, and valid for writes per the caller's contract.
    unsafe { out.write(value) };
    Ok(())
}

/// Copies `text` NUL-terminated into a caller buffer of `length` bytes.
///
/// # Safety
/// `buf` is null or valid for writes of `length` bytes.
pub unsafe fn write_str(buf: *mut c_char, length: c_uint, text: &str) -> NvmlResult {
    if buf.is_null() {
        return Err(Status::INVALID_ARGUMENT);
    }
    let bytes = text.as_bytes();
    if usize::try_from(length).map_or(true, |length| bytes.len() >= length) {
        return Err(Status::INSUFFICIENT_SIZE);
    }
    // SAFETY: bytes.len() + 1 <= length, which the caller guarantees is writable;
    // a Rust string cannot overlap a caller-owned buffer.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        buf.add(bytes.len()).write(0);
    }
    Ok(())
}

/// Writes `text` into a fixed C array, NUL-terminated; left empty if it cannot fit.
pub fn fill_array<const N: usize>(array: &mut [c_char; N], text: &str) {
    let bytes = text.as_bytes();
    if bytes.len() < N {
        for (slot, &byte) in array.iter_mut().zip(bytes) {
            *slot = byte as c_char;
        }
        array[bytes.len()] = 0;
    }
}

/// Reads a caller's C string argument.
///
/// # Safety
/// `text` is null or points to a NUL-terminated string.
pub unsafe fn read_str<'a>(text: *const c_char) -> NvmlResult<&'a str> {
    if text.is_null() {
        return Err(Status::INVALID_ARGUMENT);
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    let text = unsafe { CStr::from_ptr(text) };
    text.to_str().map_err(|_| Status::INVALID_ARGUMENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_str_needs_room_for_the_nul() {
        let mut buf = [1 as c_char; 4];
        assert_eq!(
            unsafe { write_str(buf.as_mut_ptr(), 4, "abcd") },
            Err(Status::INSUFFICIENT_SIZE)
        );
        assert_eq!(unsafe { write_str(buf.as_mut_ptr(), 4, "abc") }, Ok(()));
        assert_eq!(buf, [b'a' as c_char, b'b' as c_char, b'c' as c_char, 0]);
        assert_eq!(
            unsafe { write_str(std::ptr::null_mut(), 4, "a") },
            Err(Status::INVALID_ARGUMENT)
        );
    }

    #[test]
    fn fill_array_skips_what_cannot_fit() {
        let mut array = [7 as c_char; 3];
        fill_array(&mut array, "abc");
        assert_eq!(array, [7; 3]);
        fill_array(&mut array, "ab");
        assert_eq!(array, [b'a' as c_char, b'b' as c_char, 0]);
    }

    #[test]
    fn guard_contains_panics() {
        assert_eq!(guard(|| Ok(())), Status::SUCCESS);
        assert_eq!(guard(|| Err(Status::NOT_FOUND)), Status::NOT_FOUND);
        assert_eq!(guard(|| panic!("boom")), Status::UNKNOWN);
    }
}
