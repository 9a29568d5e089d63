//! The plan nvhook-runtime leaves in the bundle for the prestart hook, so that one
//! container start asks NVML once, not twice. The image the plan was made for goes with it:
//! nvhook-runtime sees the image from the host, the hook through the container's mount namespace,
//! and where a volume makes the two differ the hook plans again.

use crate::atomic_file::{NewFile, write_atomic};
use crate::file_id::FileId;
use crate::plan::{ImageInfo, Plan};
use std::path::Path;

/// The file's name inside the bundle.
pub const PLAN_FILE: &str = "nvhook-plan.json";

/// nvhook-runtime's plan, with the config.json it was made for: a bundle whose config.json was
/// rewritten since (a reused bundle, a later start without nvhook-runtime) gets a fresh plan.
#[derive(serde::Serialize, serde::Deserialize)]
struct PlanFile {
    config_json: FileId,
    image: ImageInfo,
    plan: Plan,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanFileError {
    #[error("{0} is gone after it was written")]
    ConfigJsonGone(String),
    #[error("cannot encode the plan: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("cannot write the plan into the bundle {bundle}: {source}")]
    Write {
        bundle: String,
        source: std::io::Error,
    },
}

/// Leaves `plan`, made for `image`, in `bundle` for the hook, tied to the config.json now there.
pub fn write(bundle: &Path, plan: Plan, image: ImageInfo) -> Result<(), PlanFileError> {
    let config_json = bundle.join("config.json");
    let written = FileId::of(&config_json)
        .ok_or_else(|| PlanFileError::ConfigJsonGone(config_json.display().to_string()))?;
    let file = PlanFile {
        config_json: written,
        image,
        plan,
    };
    let bytes = serde_json::to_vec(&file)?;
    write_atomic(&bundle.join(PLAN_FILE), &bytes, NewFile::mode(0o600)).map_err(|source| {
        PlanFileError::Write {
            bundle: bundle.display().to_string(),
            source,
        }
    })
}

/// The plan nvhook-runtime left in the bundle, if it was made for the config.json there now and
/// for `image`.
pub fn read(bundle: &Path, image: &ImageInfo) -> Option<Plan> {
    let bytes = std::fs::read(bundle.join(PLAN_FILE)).ok()?;
    let file: PlanFile = crate::whole_file::json(&bytes)?;
    let current = FileId::of(&bundle.join("config.json"));
    if current.as_ref() != Some(&file.config_json) {
        tracing::info!("nvhook-runtime's plan was made for another config.json: not used");
        return None;
    }
    if &file.image != image {
        tracing::info!(
            "the image seen through the container's mount namespace is not the one nvhook-runtime planned for (a volume covers part of it): planning again"
        );
        return None;
    }
    Some(file.plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvhook_model::plan::fixtures::one_gpu_plan;

    #[test]
    fn the_hook_uses_nvhook_runtimes_plan_only_for_the_config_json_it_was_made_for() {
        let bundle = tempfile::tempdir().unwrap();
        let config_json = bundle.path().join("config.json");
        std::fs::write(&config_json, b"{}").unwrap();
        let image = ImageInfo::default();
        write(bundle.path(), one_gpu_plan(), image.clone()).unwrap();
        assert_eq!(read(bundle.path(), &image), Some(one_gpu_plan()));
        // The container sees another image than nvhook-runtime did (a volume covers its /etc).
        let covered = ImageInfo {
            has_ldcache: true,
            ..ImageInfo::default()
        };
        assert_eq!(read(bundle.path(), &covered), None);
        // The bundle is used again with a config.json written anew: that plan is stale.
        write_atomic(&config_json, b"{}", NewFile::mode(0o644)).unwrap();
        assert_eq!(read(bundle.path(), &image), None);
        // A plan file from before the config.json identity was recorded is not trusted.
        let plan_path = bundle.path().join(PLAN_FILE);
        std::fs::write(&plan_path, serde_json::to_vec(&one_gpu_plan()).unwrap()).unwrap();
        assert_eq!(read(bundle.path(), &image), None);
    }

    #[test]
    fn a_bundle_without_config_json_gets_no_plan_file() {
        let bundle = tempfile::tempdir().unwrap();
        let e = write(bundle.path(), one_gpu_plan(), ImageInfo::default()).unwrap_err();
        assert!(e.to_string().contains("config.json is gone"), "{e}");
        assert!(!bundle.path().join(PLAN_FILE).exists());
    }
}
