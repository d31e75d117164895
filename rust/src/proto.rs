//! The few messages of Envoy's `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`,
//! declared by hand with prost's derive (field numbers as in envoy's rls.proto, ratelimit.proto,
//! base.proto and the well-known wrappers), so the build needs no protoc.
//! Fields ratewarden never reads or writes (quota, raw_body, dynamic_metadata) are left out:
//! prost skips unknown fields when decoding.

#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitRequest {
    #[prost(string, tag = "1")]
    pub domain: String,
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<RateLimitDescriptor>,
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitDescriptor {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<Entry>,
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Entry {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitOverride {
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct UInt64Value {
    #[prost(uint64, tag = "1")]
    pub value: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimitResponse {
    #[prost(int32, tag = "1")]
    pub overall_code: i32,
    #[prost(message, repeated, tag = "2")]
    pub statuses: Vec<DescriptorStatus>,
    #[prost(message, repeated, tag = "3")]
    pub response_headers_to_add: Vec<HeaderValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DescriptorStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(message, optional, tag = "2")]
    pub current_limit: Option<RateLimit>,
    #[prost(uint32, tag = "3")]
    pub limit_remaining: u32,
    #[prost(message, optional, tag = "4")]
    pub duration_until_reset: Option<Duration>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RateLimit {
    #[prost(string, tag = "3")]
    pub name: String,
    #[prost(uint32, tag = "1")]
    pub requests_per_unit: u32,
    #[prost(int32, tag = "2")]
    pub unit: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Duration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `RateLimitResponse.Code`.
pub const CODE_OK: i32 = 1;
pub const CODE_OVER_LIMIT: i32 = 2;

/// `RateLimitResponse.RateLimit.Unit` by ratewarden's unit name (the request's override uses the
/// same numbers, without week).
pub fn unit_number(name: &str) -> Option<i32> {
    Some(match name {
        "second" => 1,
        "minute" => 2,
        "hour" => 3,
        "day" => 4,
        "month" => 5,
        "year" => 6,
        "week" => 7,
        _ => return None,
    })
}

pub fn unit_name(number: i32) -> Option<&'static str> {
    Some(match number {
        1 => "second",
        2 => "minute",
        3 => "hour",
        4 => "day",
        5 => "month",
        6 => "year",
        7 => "week",
        _ => return None,
    })
}
