//! ttrpc's envelope: the request and response every call is wrapped in (ttrpc's
//! `request.proto`, written out by hand: three small messages).

/// A call: which service and method, and the method's own message as bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Request {
    #[prost(string, tag = "1")]
    pub service: String,
    #[prost(string, tag = "2")]
    pub method: String,
    #[prost(bytes = "vec", tag = "3")]
    pub payload: Vec<u8>,
    #[prost(int64, tag = "4")]
    pub timeout_nano: i64,
    #[prost(message, repeated, tag = "5")]
    pub metadata: Vec<KeyValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// A call's answer: a status (absent or code 0 when it worked) and the method's reply.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Response {
    #[prost(message, optional, tag = "1")]
    pub status: Option<Status>,
    #[prost(bytes = "vec", tag = "2")]
    pub payload: Vec<u8>,
}

/// google.rpc.Status without its details, which NRI does not use.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Status {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
}

/// gRPC's status codes that a plugin answers with.
pub mod code {
    pub const UNKNOWN: i32 = 2;
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const UNIMPLEMENTED: i32 = 12;
}

impl Response {
    pub fn ok(payload: Vec<u8>) -> Response {
        Response {
            status: None,
            payload,
        }
    }

    pub fn error(code: i32, message: String) -> Response {
        Response {
            status: Some(Status { code, message }),
            payload: Vec::new(),
        }
    }

    /// The failure this response carries, if any.
    pub fn failure(&self) -> Option<&Status> {
        self.status.as_ref().filter(|s| s.code != 0)
    }
}
