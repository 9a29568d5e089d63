//! The one-line failures of nvhook-nvml's actions: NVML's own words for its return code, the
//! code's name, and what to do about it, which each kind of action words for itself.

use nvhook_model::inventory::NvmlActionFailure;
use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings as sys;
use std::ffi::CStr;

/// What to do about NVML's code for one kind of action; None leaves the driver's log as the
/// advice.
pub type Fix = fn(u32) -> Option<&'static str>;

/// The failure for NVML's return code `rc` from `call`, `about` what (`GPU-...`, or empty).
pub fn failure(nvml: &Nvml, call: &str, about: &str, rc: u32, fix: Fix) -> NvmlActionFailure {
    let text = match nvml.lib().nvmlErrorString.as_ref() {
        // SAFETY: nvmlErrorString returns a static NUL-terminated string for any code.
        Ok(&describe) => unsafe { CStr::from_ptr(describe(rc)) }
            .to_string_lossy()
            .into_owned(),
        Err(_) => "error".into(),
    };
    let name = match code_name(rc) {
        Some(name) => format!("NVML_ERROR_{name}, code {rc}"),
        None => format!("code {rc}"),
    };
    let fix = fix(rc).unwrap_or("see the NVIDIA driver's log (dmesg)");
    let about = match about {
        "" => String::new(),
        about => format!(" for {about}"),
    };
    NvmlActionFailure {
        code: Some(rc),
        message: format!("NVML {call} failed{about}: {text} ({name}): {fix}"),
    }
}

/// The failure of an nvml-wrapper call, with NVML's code.
pub fn wrapper_failure(
    nvml: &Nvml,
    call: &str,
    about: &str,
    error: nvml_wrapper::error::NvmlError,
    fix: Fix,
) -> NvmlActionFailure {
    failure(nvml, call, about, error.into(), fix)
}

/// The name nvml.h gives code `rc`, less its `NVML_ERROR_` prefix.
fn code_name(rc: u32) -> Option<&'static str> {
    Some(match rc {
        sys::nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => "UNINITIALIZED",
        sys::nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => "INVALID_ARGUMENT",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => "NOT_SUPPORTED",
        sys::nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => "NO_PERMISSION",
        sys::nvmlReturn_enum_NVML_ERROR_NOT_FOUND => "NOT_FOUND",
        sys::nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => "FUNCTION_NOT_FOUND",
        sys::nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => "GPU_IS_LOST",
        sys::nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM => "OPERATING_SYSTEM",
        sys::nvmlReturn_enum_NVML_ERROR_IN_USE => "IN_USE",
        sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => "INSUFFICIENT_RESOURCES",
        sys::nvmlReturn_enum_NVML_ERROR_UNKNOWN => "UNKNOWN",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvhook_model::inventory::nvml_return;

    /// The model's codes, which callers act on, are nvml.h's.
    #[test]
    fn the_models_codes_have_nvmls_names() {
        let named = [
            (nvml_return::INVALID_ARGUMENT, "INVALID_ARGUMENT"),
            (nvml_return::NOT_SUPPORTED, "NOT_SUPPORTED"),
            (nvml_return::NO_PERMISSION, "NO_PERMISSION"),
            (nvml_return::NOT_FOUND, "NOT_FOUND"),
            (nvml_return::FUNCTION_NOT_FOUND, "FUNCTION_NOT_FOUND"),
            (nvml_return::OPERATING_SYSTEM, "OPERATING_SYSTEM"),
            (nvml_return::IN_USE, "IN_USE"),
            (
                nvml_return::INSUFFICIENT_RESOURCES,
                "INSUFFICIENT_RESOURCES",
            ),
        ];
        for (code, name) in named {
            assert_eq!(code_name(code), Some(name), "code {code}");
        }
        assert_eq!(code_name(12345), None);
    }
}
