//! An in-process double of the kube-apiserver, for the objects a DRA kubelet plugin reads and
//! writes: ResourceClaims (read) and ResourceSlices (read and write), `resource.k8s.io/v1`.
//!
//! It answers plain HTTP/1.1 on 127.0.0.1, as `kube::Config::new(url)` expects, with the real
//! server's status codes and `Status` bodies, so that a plugin's error handling is tested against
//! what a cluster would say. It is stricter than a cluster in one way: a body that does not
//! round-trip through k8s-openapi's type (an unknown field, a wrong type, a wrong kind) is a 400,
//! where a cluster's default field validation would only warn, because such a body means the
//! plugin and the types it builds with disagree.

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::resource::v1::{Device, ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ObjectMeta, Time};
use k8s_openapi::serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};
use tokio::sync::oneshot;

const GROUP: &str = "resource.k8s.io";
const PREFIX: &str = "/apis/resource.k8s.io/v1/";
/// The API's limit on devices in one ResourceSlice (`ResourceSliceMaxDevices`).
const MAX_DEVICES: usize = 128;
/// The API's limits on partitionable devices (k8s.io/api resource/v1 types.go).
const MAX_DEVICES_WITH_COUNTERS: usize = 64;
const MAX_COUNTER_SETS: usize = 8;
const MAX_COUNTERS: usize = 32;
const MAX_CONSUMPTIONS: usize = 2;
const MAX_ATTRIBUTES_AND_CAPACITIES: usize = 32;
const DNS_LABEL: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric \
    characters or '-', and must start and end with an alphanumeric character";

/// The server; dropping it stops it and closes every connection.
pub struct ApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    unreachable: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    resource_version: u64,
    uids: u64,
    generated_names: u64,
    claims: BTreeMap<(String, String), ResourceClaim>,
    slices: BTreeMap<String, ResourceSlice>,
    requests: Vec<String>,
}

type Reply = (StatusCode, Value);

impl ApiServer {
    pub fn start() -> ApiServer {
        let listener =
            TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind the API server double");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener for tokio");
        let addr = listener
            .local_addr()
            .expect("the API server double's address");
        let shared = Arc::new(Shared::default());
        let (shutdown, stop) = oneshot::channel();
        let served = shared.clone();
        let thread = std::thread::Builder::new()
            .name("apiserver-double".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("the API server double's runtime");
                // Dropping the runtime afterwards cancels the connections' tasks, which closes them.
                rt.block_on(serve(listener, served, stop));
            })
            .expect("spawn the API server double's thread");
        ApiServer {
            addr,
            shared,
            shutdown: Some(shutdown),
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT`, for `kube::Config::new`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stores (or replaces) a claim, as the scheduler would have written it; its namespace and
    /// name come from its metadata.
    pub fn put_claim(&self, mut claim: ResourceClaim) {
        let mut state = self.shared.state();
        let ns = claim
            .metadata
            .namespace
            .clone()
            .expect("put_claim: metadata.namespace");
        let name = claim
            .metadata
            .name
            .clone()
            .expect("put_claim: metadata.name");
        state.stamp(&mut claim.metadata);
        state.claims.insert((ns, name), claim);
    }

    pub fn remove_claim(&self, ns: &str, name: &str) {
        self.shared
            .state()
            .claims
            .remove(&(ns.to_owned(), name.to_owned()));
    }

    /// The stored slices, by name.
    pub fn slices(&self) -> Vec<ResourceSlice> {
        self.shared.state().slices.values().cloned().collect()
    }

    /// While on, every request is read and then its connection closed with no answer: what a
    /// client sees when the API server goes away mid-request, and, with no connection kept
    /// alive, when it is unreachable.
    pub fn set_unreachable(&self, on: bool) {
        self.shared.unreachable.store(on, Ordering::SeqCst);
    }

    /// `METHOD PATH` or `METHOD PATH?QUERY` (the query as sent) of every request received, answered or not, in order.
    pub fn requests(&self) -> Vec<String> {
        self.shared.state().requests.clone()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Shared {
    // A test that panicked while holding the lock must not hide its own failure behind ours.
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    /// Gives an object what the server sets on every write.
    fn stamp(&mut self, meta: &mut ObjectMeta) {
        self.resource_version += 1;
        meta.resource_version = Some(self.resource_version.to_string());
        if meta.uid.is_none() {
            self.uids += 1;
            meta.uid = Some(format!("00000000-0000-4000-8000-{:012x}", self.uids));
        }
        if meta.creation_timestamp.is_none() {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let now = k8s_openapi::jiff::Timestamp::from_second(now.as_secs() as i64)
                .expect("the clock within jiff's range");
            meta.creation_timestamp = Some(Time(now));
        }
    }

    fn route(
        &mut self,
        method: &Method,
        path: &str,
        query: &str,
        body: &[u8],
    ) -> Result<Reply, Reply> {
        let rest = path.strip_prefix(PREFIX).ok_or_else(not_found_path)?;
        let params = parse_query(query);
        if params.contains_key("watch") {
            return Err(bad_request(
                "the API server double does not serve watches".into(),
            ));
        }
        match (method, rest.split('/').collect::<Vec<_>>().as_slice()) {
            (&Method::GET, ["namespaces", ns, "resourceclaims", name]) => {
                let claim = self.claims.get(&(ns.to_string(), name.to_string()));
                Ok((
                    StatusCode::OK,
                    to_json(claim.ok_or_else(|| not_found("resourceclaims", name))?),
                ))
            }
            (&Method::GET, ["resourceslices"]) => {
                let names = selected(&self.slices, &params)?;
                let items = names.iter().map(|name| to_json(&self.slices[name]));
                Ok((StatusCode::OK, self.list_of(items.collect())))
            }
            (&Method::POST, ["resourceslices"]) => self.create(body),
            (&Method::DELETE, ["resourceslices"]) => self.delete_collection(&params, body),
            (&Method::GET, ["resourceslices", name]) => {
                Ok((StatusCode::OK, to_json(self.slice(name)?)))
            }
            (&Method::PUT, ["resourceslices", name]) => self.replace(name, body),
            (&Method::DELETE, ["resourceslices", name]) => self.delete(name, body),
            (
                _,
                ["namespaces", _, "resourceclaims", _] | ["resourceslices"] | ["resourceslices", _],
            ) => {
                let message = format!(
                    "the server does not allow this method on the requested resource: {method}"
                );
                Err(status(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "MethodNotAllowed",
                    message,
                    json!({}),
                ))
            }
            _ => Err(not_found_path()),
        }
    }

    fn slice(&self, name: &str) -> Result<&ResourceSlice, Reply> {
        self.slices
            .get(name)
            .ok_or_else(|| not_found("resourceslices", name))
    }

    fn list_of(&self, items: Vec<Value>) -> Value {
        json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSliceList",
            "metadata": {"resourceVersion": self.resource_version.to_string()},
            "items": items,
        })
    }

    fn create(&mut self, body: &[u8]) -> Result<Reply, Reply> {
        let mut slice: ResourceSlice = decode(body, "ResourceSlice")?;
        let meta = &mut slice.metadata;
        if let (None, Some(prefix)) = (
            meta.name.as_ref().filter(|n| !n.is_empty()),
            meta.generate_name.clone(),
        ) {
            meta.name = Some(self.generate_name(&prefix));
        }
        validate(&slice)?;
        let name = slice.metadata.name.clone().unwrap_or_default();
        if self.slices.contains_key(&name) {
            let message = format!("resourceslices.{GROUP} \"{name}\" already exists");
            return Err(status(
                StatusCode::CONFLICT,
                "AlreadyExists",
                message,
                details(&name),
            ));
        }
        // The storage layer's check, hence the real server's 500.
        if slice
            .metadata
            .resource_version
            .as_ref()
            .is_some_and(|v| !v.is_empty())
        {
            let message = "resourceVersion should not be set on objects to be created".to_owned();
            return Err(status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                message,
                json!({}),
            ));
        }
        // The client's values of server-set fields are not the server's.
        slice.metadata.uid = None;
        slice.metadata.creation_timestamp = None;
        slice.metadata.generation = Some(1);
        self.stamp(&mut slice.metadata);
        self.slices.insert(name, slice.clone());
        Ok((StatusCode::CREATED, to_json(&slice)))
    }

    fn generate_name(&mut self, prefix: &str) -> String {
        // The alphabet the real server draws its 5-character suffixes from.
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        loop {
            self.generated_names += 1;
            let mut n = self.generated_names as usize;
            let mut name = prefix.to_owned();
            for _ in 0..5 {
                name.push(ALPHABET[n % ALPHABET.len()] as char);
                n /= ALPHABET.len();
            }
            if !self.slices.contains_key(&name) {
                return name;
            }
        }
    }

    fn replace(&mut self, name: &str, body: &[u8]) -> Result<Reply, Reply> {
        let mut slice: ResourceSlice = decode(body, "ResourceSlice")?;
        let named = slice.metadata.name.clone().unwrap_or_default();
        if named != name {
            let message = format!(
                "the name of the object ({named}) does not match the name on the URL ({name})"
            );
            return Err(bad_request(message));
        }
        let old = self.slice(name)?;
        let sent_version = slice
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default();
        if !sent_version.is_empty()
            && Some(sent_version) != old.metadata.resource_version.as_deref()
        {
            return Err(conflict(name));
        }
        validate(&slice)?;
        let spec_changed = slice.spec != old.spec;
        slice.metadata.uid.clone_from(&old.metadata.uid);
        slice
            .metadata
            .creation_timestamp
            .clone_from(&old.metadata.creation_timestamp);
        slice
            .metadata
            .resource_version
            .clone_from(&old.metadata.resource_version);
        slice.metadata.generation =
            Some(old.metadata.generation.unwrap_or(1) + i64::from(spec_changed));
        // As the real server, a write that changes nothing is no write: no new resourceVersion.
        if slice != *old {
            self.stamp(&mut slice.metadata);
            self.slices.insert(name.to_owned(), slice.clone());
        }
        Ok((StatusCode::OK, to_json(&slice)))
    }

    fn delete(&mut self, name: &str, body: &[u8]) -> Result<Reply, Reply> {
        let options = delete_options(body)?;
        let meta = &self.slice(name)?.metadata;
        let stale = |want: &Option<String>, have: &Option<String>| want.is_some() && want != have;
        if let Some(pre) = &options.preconditions
            && (stale(&pre.uid, &meta.uid) || stale(&pre.resource_version, &meta.resource_version))
        {
            return Err(conflict(name));
        }
        let mut details = details(name);
        details["uid"] = json!(meta.uid);
        if options.dry_run.unwrap_or_default().is_empty() {
            self.slices.remove(name);
            self.resource_version += 1;
        }
        // The generic registry answers a delete with a Status, not the object, unless the
        // resource opts out, which ResourceSlices do not.
        let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details});
        Ok((StatusCode::OK, body))
    }

    fn delete_collection(
        &mut self,
        params: &BTreeMap<String, String>,
        body: &[u8],
    ) -> Result<Reply, Reply> {
        let dry_run = !delete_options(body)?.dry_run.unwrap_or_default().is_empty();
        let mut items = Vec::new();
        for name in selected(&self.slices, params)? {
            items.push(to_json(&self.slices[&name]));
            if !dry_run {
                self.slices.remove(&name);
                self.resource_version += 1;
            }
        }
        Ok((StatusCode::OK, self.list_of(items)))
    }
}

async fn serve(listener: TcpListener, shared: Arc<Shared>, mut stop: oneshot::Receiver<()>) {
    let listener = tokio::net::TcpListener::from_std(listener).expect("the listener in tokio");
    loop {
        tokio::select! {
            _ = &mut stop => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| handle(shared.clone(), req));
                    // A connection's end, clean or not, is the client's business.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> io::Result<Response<Full<Bytes>>> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().unwrap_or_default().to_owned();
    let target = parts
        .uri
        .path_and_query()
        .map_or(path.as_str(), |target| target.as_str());
    shared
        .state()
        .requests
        .push(format!("{} {target}", parts.method));
    let body = body.collect().await.map_err(io::Error::other)?.to_bytes();
    // hyper closes a connection whose service fails, without an answer.
    if shared.unreachable.load(Ordering::SeqCst) {
        return Err(io::Error::other("the API server double is unreachable"));
    }
    let (code, value) = shared
        .state()
        .route(&parts.method, &path, &query, &body)
        .unwrap_or_else(|e| e);
    let body = serde_json::to_vec(&value).expect("JSON of a serde_json::Value");
    Ok(Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("a response from a valid status and header"))
}

/// Parses a body as `T`, and refuses one that does not serialize back to what was sent: serde
/// ignores unknown fields and defaults missing ones, which would hide a client's mistake.
fn decode<T: DeserializeOwned + Serialize>(body: &[u8], kind: &str) -> Result<T, Reply> {
    let mut sent: Value = serde_json::from_slice(body)
        .map_err(|e| bad_request(format!("the body is not JSON: {e}")))?;
    let parsed: T = serde_json::from_value(sent.clone())
        .map_err(|e| bad_request(format!("the body is not a {kind}: {e}")))?;
    let mut back = serde_json::to_value(&parsed).expect("JSON of a k8s-openapi object");
    // A null is an absent optional field to the real server too.
    drop_nulls(&mut sent);
    for value in [&mut sent, &mut back] {
        if let Some(meta) = value.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in ["uid", "resourceVersion", "creationTimestamp", "generation"] {
                meta.remove(field);
            }
        }
    }
    match difference(&sent, &back, "") {
        Some(problem) => Err(bad_request(format!(
            "the body is not a valid {kind}: {problem}"
        ))),
        None => Ok(parsed),
    }
}

fn delete_options(body: &[u8]) -> Result<DeleteOptions, Reply> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(DeleteOptions::default());
    }
    decode(body, "DeleteOptions")
}

fn drop_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// The first place where `back` (the body as k8s-openapi read it) differs from `sent`.
fn difference(sent: &Value, back: &Value, at: &str) -> Option<String> {
    let field = |key: &str| [at, key].join(if at.is_empty() { "" } else { "." });
    match (sent, back) {
        (Value::Object(sent), Value::Object(back)) => {
            for (key, value) in sent {
                let Some(read) = back.get(key) else {
                    return Some(format!("unknown field \"{}\"", field(key)));
                };
                if let Some(problem) = difference(value, read, &field(key)) {
                    return Some(problem);
                }
            }
            let missing = back.keys().find(|key| !sent.contains_key(*key))?;
            Some(format!("missing required field \"{}\"", field(missing)))
        }
        (Value::Array(sent), Value::Array(back)) if sent.len() == back.len() => sent
            .iter()
            .zip(back)
            .enumerate()
            .find_map(|(i, (value, read))| difference(value, read, &format!("{at}[{i}]"))),
        _ if sent == back => None,
        _ => Some(format!("{at}: {sent} reads back as {back}")),
    }
}

/// The checks of the real server's ResourceSlice validation that a driver can fail.
fn validate(slice: &ResourceSlice) -> Result<(), Reply> {
    let mut causes: Vec<(String, String)> = Vec::new();
    let mut invalid = |field: &str, message: String| causes.push((field.to_owned(), message));
    let name = slice.metadata.name.as_deref().unwrap_or_default();
    if name.is_empty() {
        invalid(
            "metadata.name",
            "Required value: name or generateName is required".into(),
        );
    } else if !is_dns_subdomain(name) {
        invalid(
            "metadata.name",
            format!("Invalid value: \"{name}\": must be a DNS subdomain"),
        );
    }
    if slice.spec.driver.is_empty() {
        invalid("spec.driver", "Required value".into());
    }
    if slice.spec.pool.name.is_empty() {
        invalid("spec.pool.name", "Required value".into());
    }
    let devices = slice.spec.devices.as_deref().unwrap_or_default();
    let sets = slice.spec.shared_counters.as_deref().unwrap_or_default();
    if !devices.is_empty() && !sets.is_empty() {
        invalid(
            "spec",
            "Invalid value: only one of devices and sharedCounters may be set".into(),
        );
    }
    let consuming = devices.iter().any(|d| d.consumes_counters.is_some());
    let most = match consuming {
        true => MAX_DEVICES_WITH_COUNTERS,
        false => MAX_DEVICES,
    };
    if devices.len() > most {
        let count = devices.len();
        invalid(
            "spec.devices",
            format!("Too many: {count}: must have at most {most} items"),
        );
    }
    let mut seen = HashSet::new();
    for (i, device) in devices.iter().enumerate() {
        let Device { name, .. } = device;
        let field = format!("spec.devices[{i}].name");
        if !is_dns_label(name) {
            invalid(&field, format!("Invalid value: \"{name}\": {DNS_LABEL}"));
        } else if !seen.insert(name) {
            invalid(&field, format!("Duplicate value: \"{name}\""));
        }
        let described = device.attributes.as_ref().map_or(0, |a| a.len())
            + device.capacity.as_ref().map_or(0, |c| c.len());
        if described > MAX_ATTRIBUTES_AND_CAPACITIES {
            invalid(
                &format!("spec.devices[{i}]"),
                format!(
                    "Too many: {described}: must have at most {MAX_ATTRIBUTES_AND_CAPACITIES} attributes and capacities combined"
                ),
            );
        }
        let consumed = device.consumes_counters.as_deref().unwrap_or_default();
        if consumed.len() > MAX_CONSUMPTIONS {
            invalid(
                &format!("spec.devices[{i}].consumesCounters"),
                format!(
                    "Too many: {}: must have at most {MAX_CONSUMPTIONS} items",
                    consumed.len()
                ),
            );
        }
        for (j, c) in consumed.iter().enumerate() {
            counted(
                &mut invalid,
                &format!("spec.devices[{i}].consumesCounters[{j}]"),
                &c.counter_set,
                &c.counters,
            );
        }
    }
    if sets.len() > MAX_COUNTER_SETS {
        invalid(
            "spec.sharedCounters",
            format!(
                "Too many: {}: must have at most {MAX_COUNTER_SETS} items",
                sets.len()
            ),
        );
    }
    for (i, set) in sets.iter().enumerate() {
        counted(
            &mut invalid,
            &format!("spec.sharedCounters[{i}]"),
            &set.name,
            &set.counters,
        );
    }
    if causes.is_empty() {
        return Ok(());
    }
    let summary: Vec<String> = causes
        .iter()
        .map(|(field, why)| format!("{field}: {why}"))
        .collect();
    let message = format!(
        "ResourceSlice.{GROUP} \"{name}\" is invalid: [{}]",
        summary.join(", ")
    );
    let causes: Vec<Value> = causes
        .iter()
        .map(|(field, why)| json!({"reason": "FieldValueInvalid", "message": why, "field": field}))
        .collect();
    let details = json!({"name": name, "group": GROUP, "kind": "ResourceSlice", "causes": causes});
    Err(status(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        message,
        details,
    ))
}

/// A counter set's or a consumption's name and counters: DNS labels, at most 32 counters.
fn counted(
    invalid: &mut impl FnMut(&str, String),
    at: &str,
    set: &str,
    counters: &std::collections::BTreeMap<String, k8s_openapi::api::resource::v1::Counter>,
) {
    if !is_dns_label(set) {
        invalid(at, format!("Invalid value: \"{set}\": {DNS_LABEL}"));
    }
    if counters.len() > MAX_COUNTERS {
        invalid(
            &format!("{at}.counters"),
            format!(
                "Too many: {}: must have at most {MAX_COUNTERS} items",
                counters.len()
            ),
        );
    }
    for name in counters.keys().filter(|n| !is_dns_label(n)) {
        invalid(
            &format!("{at}.counters"),
            format!("Invalid value: \"{name}\": {DNS_LABEL}"),
        );
    }
}

fn is_dns_label(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let inner = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    name.len() <= 63
        && edge(name.chars().next())
        && edge(name.chars().last())
        && name.chars().all(inner)
}

fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

/// The names of the slices that a request's `labelSelector` and `fieldSelector` select; both
/// only of the `key=value[,key=value]` form, which is what a driver uses.
fn selected(
    slices: &BTreeMap<String, ResourceSlice>,
    params: &BTreeMap<String, String>,
) -> Result<Vec<String>, Reply> {
    let labels = requirements(params.get("labelSelector"))?;
    let fields = requirements(params.get("fieldSelector"))?;
    let selectable = ["metadata.name", "spec.nodeName", "spec.driver"];
    if let Some((key, _)) = fields
        .iter()
        .find(|(key, _)| !selectable.contains(&key.as_str()))
    {
        return Err(bad_request(format!("field label not supported: {key}")));
    }
    let selects = |slice: &ResourceSlice| {
        let own = slice.metadata.labels.clone().unwrap_or_default();
        labels
            .iter()
            .all(|(key, value)| own.get(key) == Some(value))
            && fields
                .iter()
                .all(|(key, value)| field_of(slice, key) == Some(value))
    };
    Ok(slices
        .iter()
        .filter(|(_, slice)| selects(slice))
        .map(|(name, _)| name.clone())
        .collect())
}

/// The fields the real server selects ResourceSlices by.
fn field_of<'a>(slice: &'a ResourceSlice, key: &str) -> Option<&'a str> {
    match key {
        "metadata.name" => Some(slice.metadata.name.as_deref().unwrap_or_default()),
        "spec.nodeName" => Some(slice.spec.node_name.as_deref().unwrap_or_default()),
        "spec.driver" => Some(&slice.spec.driver),
        _ => None,
    }
}

fn requirements(selector: Option<&String>) -> Result<Vec<(String, String)>, Reply> {
    let terms = selector.map(|s| s.split(',').filter(|term| !term.is_empty()));
    terms
        .into_iter()
        .flatten()
        .map(
            |term| match term.split_once("==").or_else(|| term.split_once('=')) {
                Some((key, value)) if !key.ends_with('!') => {
                    Ok((key.trim().into(), value.trim().into()))
                }
                _ => Err(bad_request(format!(
                    "the API server double reads only key=value selectors, not \"{term}\""
                ))),
            },
        )
        .collect()
}

fn parse_query(query: &str) -> BTreeMap<String, String> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(key), percent_decode(value))
        })
        .collect()
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = text
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (byte, _) => out.push(byte),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn to_json<T: Serialize>(object: &T) -> Value {
    serde_json::to_value(object).expect("JSON of a k8s-openapi object")
}

fn details(name: &str) -> Value {
    json!({"name": name, "group": GROUP, "kind": "resourceslices"})
}

fn status(code: StatusCode, reason: &str, message: String, details: Value) -> Reply {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "details": details, "code": code.as_u16(),
    });
    (code, body)
}

fn bad_request(message: String) -> Reply {
    status(StatusCode::BAD_REQUEST, "BadRequest", message, json!({}))
}

fn not_found(resource: &str, name: &str) -> Reply {
    let message = format!("{resource}.{GROUP} \"{name}\" not found");
    let details = json!({"name": name, "group": GROUP, "kind": resource});
    status(StatusCode::NOT_FOUND, "NotFound", message, details)
}

fn not_found_path() -> Reply {
    let message = "the server could not find the requested resource".to_owned();
    status(StatusCode::NOT_FOUND, "NotFound", message, json!({}))
}

fn conflict(name: &str) -> Reply {
    let message = format!(
        "Operation cannot be fulfilled on resourceslices.{GROUP} \"{name}\": the object has been \
         modified; please apply your changes to the latest version and try again"
    );
    status(StatusCode::CONFLICT, "Conflict", message, details(name))
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpStream;

    use k8s_openapi::api::resource::v1::{Counter, CounterSet, DeviceCounterConsumption};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kube::api::{Api, DeleteParams, ListParams, PostParams};

    use super::*;

    fn client(server: &ApiServer) -> kube::Client {
        kube::Client::try_from(kube::Config::new(server.url().parse().unwrap())).unwrap()
    }

    fn slice<S: Into<String>>(
        name: &str,
        node: &str,
        devices: impl IntoIterator<Item = S>,
    ) -> ResourceSlice {
        let mut slice = ResourceSlice::default();
        slice.metadata.name = Some(name.into());
        slice.metadata.labels = Some([("node".to_owned(), node.to_owned())].into());
        slice.spec.driver = "gpu.nvhook.dev".into();
        slice.spec.node_name = Some(node.into());
        slice.spec.pool.name = node.into();
        slice.spec.pool.resource_slice_count = 1;
        let devices = devices.into_iter().map(|name| Device {
            name: name.into(),
            ..Default::default()
        });
        slice.spec.devices = Some(devices.collect());
        slice
    }

    /// The code and reason of the API error a call must have failed with.
    fn refusal<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
        match result {
            Err(kube::Error::Api(status)) => (status.code, status.reason),
            other => panic!("expected an API error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn claims_are_served_by_namespace_and_name() {
        let server = ApiServer::start();
        let claims: Api<ResourceClaim> = Api::namespaced(client(&server), "team-a");
        let mut claim = ResourceClaim::default();
        claim.metadata.namespace = Some("team-a".into());
        claim.metadata.name = Some("gpu".into());
        server.put_claim(claim);

        let got = claims.get("gpu").await.unwrap();
        assert_eq!(got.metadata.name.as_deref(), Some("gpu"));
        assert!(got.metadata.uid.is_some() && got.metadata.resource_version.is_some());
        assert_eq!(refusal(claims.get("other").await), (404, "NotFound".into()));
        server.remove_claim("team-a", "gpu");
        assert_eq!(refusal(claims.get("gpu").await), (404, "NotFound".into()));
        let first = "GET /apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/gpu";
        assert_eq!(server.requests()[0], first);
    }

    #[tokio::test]
    async fn slices_are_created_listed_replaced_and_deleted() {
        let server = ApiServer::start();
        let slices: Api<ResourceSlice> = Api::all(client(&server));
        let pp = PostParams::default();
        let a = slices
            .create(&pp, &slice("node-a-gpus", "node-a", ["gpu-0", "gpu-1"]))
            .await
            .unwrap();
        assert_eq!(a.metadata.generation, Some(1));
        assert!(a.metadata.uid.is_some() && a.metadata.creation_timestamp.is_some());
        slices
            .create(&pp, &slice("node-b-gpus", "node-b", ["gpu-0"]))
            .await
            .unwrap();
        let mut generated = slice("", "node-b", ["gpu-1"]);
        generated.metadata.name = None;
        generated.metadata.generate_name = Some("node-b-".into());
        let generated = slices.create(&pp, &generated).await.unwrap();
        assert!(generated.metadata.name.unwrap().starts_with("node-b-"));
        let taken = slices
            .create(&pp, &slice("node-b-gpus", "node-b", ["gpu-0"]))
            .await;
        assert_eq!(refusal(taken), (409, "AlreadyExists".into()));

        let on_a = slices
            .list(&ListParams::default().fields("spec.nodeName=node-a"))
            .await
            .unwrap();
        assert_eq!(on_a.items.len(), 1);
        assert_eq!(on_a.metadata.resource_version.as_deref(), Some("3"));
        let on_b = slices
            .list(&ListParams::default().labels("node=node-b"))
            .await
            .unwrap();
        assert_eq!(on_b.items.len(), 2);

        let mut changed = slices.get("node-a-gpus").await.unwrap();
        changed.spec.devices.as_mut().unwrap().pop();
        let replaced = slices.replace("node-a-gpus", &pp, &changed).await.unwrap();
        assert_eq!(replaced.metadata.generation, Some(2));
        assert_eq!(replaced.metadata.uid, a.metadata.uid);
        assert_eq!(replaced.metadata.resource_version.as_deref(), Some("4"));
        let stale = slices.replace("node-a-gpus", &pp, &changed).await;
        assert_eq!(refusal(stale), (409, "Conflict".into()));

        slices
            .delete("node-a-gpus", &DeleteParams::default())
            .await
            .unwrap();
        assert_eq!(
            refusal(slices.get("node-a-gpus").await),
            (404, "NotFound".into())
        );
        let lp = ListParams::default().labels("node=node-b");
        let deleted = slices
            .delete_collection(&DeleteParams::default(), &lp)
            .await
            .unwrap();
        assert_eq!(deleted.left().map(|list| list.items.len()), Some(2));
        assert!(server.slices().is_empty());
        let collection =
            "DELETE /apis/resource.k8s.io/v1/resourceslices?&labelSelector=node%3Dnode-b";
        assert_eq!(server.requests().last().unwrap(), collection);
    }

    #[tokio::test]
    async fn invalid_slices_are_refused() {
        let server = ApiServer::start();
        let slices: Api<ResourceSlice> = Api::all(client(&server));
        let mut no_driver = slice("s", "node-a", ["gpu-0"]);
        no_driver.spec.driver.clear();
        let mut no_pool = slice("s", "node-a", ["gpu-0"]);
        no_pool.spec.pool.name.clear();
        let set = |name: &str, counters: usize| CounterSet {
            name: name.into(),
            counters: (0..counters)
                .map(|i| {
                    let value = Counter {
                        value: Quantity("1".into()),
                    };
                    (format!("memory-slice-{i}"), value)
                })
                .collect(),
        };
        let mut both = slice("s", "node-a", ["gpu-0"]);
        both.spec.shared_counters = Some(vec![set("gpu-0-counter-set", 1)]);
        let mut nine_sets = slice("s", "node-a", [] as [&str; 0]);
        nine_sets.spec.devices = None;
        nine_sets.spec.shared_counters =
            Some((0..9).map(|i| set(&format!("gpu-{i}"), 1)).collect());
        let mut many_counters = nine_sets.clone();
        many_counters.spec.shared_counters = Some(vec![set("gpu-0", 33)]);
        let mut bad_set_name = nine_sets.clone();
        bad_set_name.spec.shared_counters = Some(vec![set("GPU_0", 1)]);
        let consuming = |devices: usize| {
            let mut s = slice("s", "node-a", (0..devices).map(|i| format!("mig-{i}")));
            for device in s.spec.devices.iter_mut().flatten() {
                device.consumes_counters = Some(vec![DeviceCounterConsumption {
                    counter_set: "gpu-0-counter-set".into(),
                    counters: set("x", 1).counters,
                    ..Default::default()
                }]);
            }
            s
        };
        for (bad, field) in [
            (both, "spec"),
            (nine_sets, "spec.sharedCounters"),
            (many_counters, "spec.sharedCounters[0].counters"),
            (bad_set_name, "spec.sharedCounters[0]"),
            (consuming(65), "spec.devices"),
            (slice("s", "node-a", ["GPU_0"]), "spec.devices[0].name"),
            (
                slice("s", "node-a", ["gpu-0", "gpu-0"]),
                "spec.devices[1].name",
            ),
            (
                slice("s", "node-a", [&"g".repeat(64)]),
                "spec.devices[0].name",
            ),
            (
                slice("s", "node-a", (0..129).map(|i| format!("gpu-{i}"))),
                "spec.devices",
            ),
            (no_driver, "spec.driver"),
            (no_pool, "spec.pool.name"),
        ] {
            match slices.create(&PostParams::default(), &bad).await {
                Err(kube::Error::Api(status)) => {
                    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
                    assert!(
                        status.message.contains(&format!("{field}: ")),
                        "{}",
                        status.message
                    );
                }
                other => panic!("{field}: expected a 422, got {other:?}"),
            }
        }
        assert!(server.slices().is_empty());
        slices
            .create(&PostParams::default(), &consuming(64))
            .await
            .expect("64 devices with counters are as many as a slice may list");
    }

    /// Posts a body that no typed client would send.
    fn post(server: &ApiServer, body: &Value) -> (u16, Value) {
        let mut stream = TcpStream::connect(server.addr).unwrap();
        let body = body.to_string();
        let head =
            "POST /apis/resource.k8s.io/v1/resourceslices HTTP/1.1\r\nHost: x\r\nConnection: close";
        write!(
            stream,
            "{head}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap();
        let code = answer[9..12].parse().unwrap();
        (
            code,
            serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).unwrap(),
        )
    }

    #[test]
    fn bodies_that_do_not_round_trip_are_refused() {
        let server = ApiServer::start();
        let good = to_json(&slice("s", "node-a", ["gpu-0"]));
        let mut cases: Vec<(Value, &str)> = Vec::new();
        let mut case = |problem, edit: &dyn Fn(&mut Value)| {
            let mut body = good.clone();
            edit(&mut body);
            cases.push((body, problem));
        };
        case("unknown field \"spec.devices[0].colour\"", &|b| {
            b["spec"]["devices"][0]["colour"] = json!("green")
        });
        case("not a ResourceSlice: invalid type: integer `7`", &|b| {
            b["spec"]["nodeName"] = json!(7)
        });
        case("resource.k8s.io/v1beta1", &|b| {
            b["apiVersion"] = json!("resource.k8s.io/v1beta1")
        });
        case("ResourceClaim", &|b| b["kind"] = json!("ResourceClaim"));
        case("missing required field \"spec.driver\"", &|b| {
            b["spec"].as_object_mut().unwrap().remove("driver");
        });
        for (body, problem) in cases {
            let (code, status) = post(&server, &body);
            assert_eq!(
                (code, status["reason"].as_str()),
                (400, Some("BadRequest")),
                "{problem}"
            );
            let message = status["message"].as_str().unwrap();
            assert!(message.contains(problem), "{problem}: {message}");
        }
        assert_eq!(post(&server, &good).0, 201);
        assert_eq!(server.slices().len(), 1);
    }

    #[tokio::test]
    async fn unreachable_mode_fails_calls_until_it_ends() {
        let server = ApiServer::start();
        let slices: Api<ResourceSlice> = Api::all(client(&server));
        slices.list(&ListParams::default()).await.unwrap();
        server.set_unreachable(true);
        let err = slices.list(&ListParams::default()).await.unwrap_err();
        assert!(!matches!(err, kube::Error::Api(_)), "{err:?}");
        server.set_unreachable(false);
        slices.list(&ListParams::default()).await.unwrap();
        assert_eq!(server.requests().len(), 3);
    }
}
