//! The crate's types to and from each generation of the kubelet's messages.

use crate::api::{health, v1, v1beta1};
use crate::{Claim, DeviceHealth, Health, PreparedDevice};

/// The same claim message in v1 and v1beta1.
macro_rules! claim_from {
    ($($version:ident),*) => {$(
        impl From<$version::Claim> for Claim {
            fn from(c: $version::Claim) -> Claim {
                Claim { namespace: c.namespace, uid: c.uid, name: c.name }
            }
        }

        impl From<&Claim> for $version::Claim {
            fn from(c: &Claim) -> $version::Claim {
                $version::Claim {
                    namespace: c.namespace.clone(),
                    uid: c.uid.clone(),
                    name: c.name.clone(),
                }
            }
        }
    )*};
}
claim_from!(v1, v1beta1);

impl From<PreparedDevice> for v1::Device {
    fn from(d: PreparedDevice) -> v1::Device {
        v1::Device {
            request_names: d.requests,
            pool_name: d.pool,
            device_name: d.device,
            cdi_device_ids: d.cdi_ids,
            share_id: None,
        }
    }
}

impl From<PreparedDevice> for v1beta1::Device {
    fn from(d: PreparedDevice) -> v1beta1::Device {
        v1beta1::Device {
            request_names: d.requests,
            pool_name: d.pool,
            device_name: d.device,
            cdi_device_ids: d.cdi_ids,
        }
    }
}

impl From<v1::Device> for PreparedDevice {
    fn from(d: v1::Device) -> PreparedDevice {
        PreparedDevice {
            requests: d.request_names,
            pool: d.pool_name,
            device: d.device_name,
            cdi_ids: d.cdi_device_ids,
        }
    }
}

impl From<v1beta1::Device> for PreparedDevice {
    fn from(d: v1beta1::Device) -> PreparedDevice {
        PreparedDevice {
            requests: d.request_names,
            pool: d.pool_name,
            device: d.device_name,
            cdi_ids: d.cdi_device_ids,
        }
    }
}

impl From<&DeviceHealth> for health::DeviceHealth {
    fn from(d: &DeviceHealth) -> health::DeviceHealth {
        health::DeviceHealth {
            device: Some(health::DeviceIdentifier {
                pool_name: d.pool.clone(),
                device_name: d.device.clone(),
            }),
            health: match d.health {
                Health::Unknown => health::HealthStatus::Unknown,
                Health::Healthy => health::HealthStatus::Healthy,
                Health::Unhealthy => health::HealthStatus::Unhealthy,
            } as i32,
            last_updated_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX)),
            health_check_timeout_seconds: 0,
            message: d.message.clone(),
        }
    }
}

impl From<health::DeviceHealth> for DeviceHealth {
    fn from(d: health::DeviceHealth) -> DeviceHealth {
        let id = d.device.unwrap_or_default();
        DeviceHealth {
            pool: id.pool_name,
            device: id.device_name,
            health: match health::HealthStatus::try_from(d.health) {
                Ok(health::HealthStatus::Healthy) => Health::Healthy,
                Ok(health::HealthStatus::Unhealthy) => Health::Unhealthy,
                _ => Health::Unknown,
            },
            message: d.message,
        }
    }
}
