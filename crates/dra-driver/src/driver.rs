//! The plugin's driver: a claim the kubelet names, read from the API server, prepared by
//! nvhook's DRA policy on the node's inventory.

use anyhow::{Context, Result};
use k8s_openapi::api::resource::v1::ResourceClaim;
use nvhook::dra::claims::{Allocated, ClaimView, Claims, Node, NodeError};
use nvhook::dra::devices::DraDevice;
use nvhook::inventory::isolated::Remembered;
use nvhook::inventory::mig_admin;
use nvhook::inventory::{Inventory, Scope};
use nvhook_dra::{Claim, DeviceHealth, Driver, Health, PreparedDevice};
use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

/// How long one read of a claim may take: the kubelet's own call has a deadline.
const API_TIMEOUT: Duration = Duration::from_secs(10);

/// A client of the API server at `url` (no credentials), or as kubectl would find one.
pub async fn client(url: Option<&str>) -> Result<kube::Client> {
    let config = match url {
        Some(url) => kube::Config::new(
            url.parse()
                .with_context(|| format!("--api-server {url:?} is not a URL"))?,
        ),
        None => kube::Config::infer()
            .await
            .context("no API server: not in a pod with a service account, and no KUBECONFIG")?,
    };
    kube::Client::try_from(config).context("cannot make an API client")
}

pub struct GpuDriver {
    claims: Claims,
    client: kube::Client,
    runtime: tokio::runtime::Handle,
    /// NVML's answer for the host as it is, asked once, not per claim.
    nvml: Mutex<Remembered>,
    /// Every device the node has offered since the plugin started: one gone is unhealthy.
    seen: Mutex<BTreeSet<String>>,
}

impl GpuDriver {
    pub fn new(claims: Claims, client: kube::Client, runtime: tokio::runtime::Handle) -> GpuDriver {
        GpuDriver {
            claims,
            client,
            runtime,
            nvml: Mutex::new(Remembered::default()),
            seen: Mutex::new(BTreeSet::new()),
        }
    }

    /// The claim as the API server has it now; refused when it is not the one the kubelet
    /// means (deleted and made again under the same name).
    fn read(&self, claim: &Claim) -> Result<ClaimView, String> {
        // An empty name would make the read a list of the namespace's claims.
        if claim.namespace.is_empty() || claim.name.is_empty() || claim.uid.is_empty() {
            return Err(format!(
                "the kubelet named a claim without a namespace, name or uid ({claim:?}): nothing prepared"
            ));
        }
        let api: kube::Api<ResourceClaim> =
            kube::Api::namespaced(self.client.clone(), &claim.namespace);
        let id = format!("{}/{}", claim.namespace, claim.name);
        let got = self
            .runtime
            .block_on(async { tokio::time::timeout(API_TIMEOUT, api.get(&claim.name)).await })
            .map_err(|_| {
                format!("cannot read claim {id} from the API server: no answer in {API_TIMEOUT:?}")
            })?
            .map_err(|e| format!("cannot read claim {id} from the API server: {e}"))?;
        let uid = got.metadata.uid.clone().unwrap_or_default();
        if uid != claim.uid {
            return Err(format!(
                "claim {id} in the API server has uid {uid}, not {}: it was deleted and made again",
                claim.uid
            ));
        }
        Ok(view(claim, &got))
    }

    /// The node's inventory now (NVML's answer kept while the host is as it was).
    pub fn inventory(&self) -> Result<Inventory, String> {
        let mut nvml = self.nvml.lock().unwrap_or_else(|e| e.into_inner());
        nvml.load(&self.claims.config, Scope::ALL)
            .map(|(inventory, _)| inventory)
            .map_err(|e| e.to_string())
    }

    /// The node's inventory and the devices it offers now.
    pub fn offered(&self) -> Result<(Inventory, Vec<DraDevice>), String> {
        let inventory = self.inventory()?;
        let offered = self.claims.offered(&inventory).map_err(|e| e.to_string())?;
        Ok((inventory, offered))
    }

    /// NVML's answer no longer holds: the plugin changed the GPUs' MIG devices.
    fn forget(&self) {
        self.nvml.lock().unwrap_or_else(|e| e.into_inner()).forget();
    }
}

impl Node for GpuDriver {
    fn inventory(&self) -> Result<Inventory, NodeError> {
        GpuDriver::inventory(self).map_err(Into::into)
    }

    fn make_mig(&self, gpu_uuid: &str, profile_id: u32, start: u32) -> Result<String, NodeError> {
        let made = mig_admin::create_mig(&self.claims.config, gpu_uuid, profile_id, start);
        self.forget();
        Ok(made?.uuid)
    }

    fn destroy_mig(&self, mig_uuid: &str) -> Result<(), NodeError> {
        let destroyed = mig_admin::destroy_mig(&self.claims.config, mig_uuid);
        self.forget();
        Ok(destroyed?)
    }
}

/// The allocation results of `got`, as the policy reads them.
fn view(claim: &Claim, got: &ResourceClaim) -> ClaimView {
    let allocation = got
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .map(|a| {
            a.devices
                .as_ref()
                .and_then(|d| d.results.as_ref())
                .into_iter()
                .flatten()
                .map(|r| Allocated {
                    request: r.request.clone(),
                    driver: r.driver.clone(),
                    pool: r.pool.clone(),
                    device: r.device.clone(),
                })
                .collect()
        });
    ClaimView {
        namespace: claim.namespace.clone(),
        name: claim.name.clone(),
        uid: claim.uid.clone(),
        allocation,
    }
}

impl Driver for GpuDriver {
    fn prepare(&self, claim: &Claim) -> Result<Vec<PreparedDevice>, String> {
        let view = self.read(claim)?;
        let prepared = self
            .claims
            .prepare(&view, self)
            .map_err(|e| e.to_string())?;
        Ok(prepared
            .into_iter()
            .map(|d| PreparedDevice {
                requests: vec![d.request],
                pool: d.pool,
                device: d.device,
                cdi_ids: vec![d.cdi_id],
            })
            .collect())
    }

    fn unprepare(&self, claim: &Claim) -> Result<(), String> {
        self.claims
            .unprepare(&claim.uid, self)
            .map_err(|e| e.to_string())
    }

    /// Each device the node offers is healthy; one it offered before and no longer has (a
    /// GPU off the bus) is not. Without an answer from NVML nothing is known.
    fn health(&self) -> Vec<DeviceHealth> {
        let pool = &self.claims.node;
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let now: BTreeSet<String> = match self.offered() {
            Ok((_, offered)) => offered.into_iter().map(|d| d.name).collect(),
            Err(e) => {
                return seen
                    .iter()
                    .map(|device| health(pool, device, Health::Unknown, &e))
                    .collect();
            }
        };
        seen.extend(now.iter().cloned());
        seen.iter()
            .map(|device| match now.contains(device) {
                true => health(pool, device, Health::Healthy, ""),
                false => health(pool, device, Health::Unhealthy, "no longer on this node"),
            })
            .collect()
    }
}

fn health(pool: &str, device: &str, health: Health, message: &str) -> DeviceHealth {
    DeviceHealth {
        pool: pool.to_string(),
        device: device.to_string(),
        health,
        message: message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    /// A cluster's API server is HTTPS: the client must be able to speak it (a build without
    /// a TLS stack refuses to make one for an https URL).
    #[test]
    fn a_client_for_an_https_api_server_can_be_made() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        for url in ["https://10.96.0.1:443", "http://127.0.0.1:8080"] {
            runtime
                .block_on(super::client(Some(url)))
                .unwrap_or_else(|e| panic!("{url}: {e:#}"));
        }
    }
}
