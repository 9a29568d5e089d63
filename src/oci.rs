//! A bundle's config.json read from disk. The OCI state and the spec subset nvhook reads are
//! the model's ([`nvhook_model::oci`]).

pub use nvhook_model::oci::*;

use std::path::Path;

/// The spec of the bundle at `bundle`.
pub fn load_spec(bundle: &Path) -> Result<Spec, OciError> {
    let path = bundle.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| OciError::ReadSpec {
        path: path.clone(),
        source,
    })?;
    Spec::parse(&text, &path)
}
