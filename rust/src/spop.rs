//! HAProxy's SPOP codec (SPOE.txt), as `serve/spop.py` reads and writes it: frames, varints,
//! typed values, and the agent's frames (AGENT-HELLO, ACK, DISCONNECT)
//! with the same DISCONNECT status codes and messages as the Python agent. The HELLO's
//! negotiation is `spop_hello.rs`.

pub const HAPROXY_HELLO: u8 = 1;
pub const HAPROXY_DISCONNECT: u8 = 2;
pub const NOTIFY: u8 = 3;
pub const AGENT_HELLO: u8 = 101;
pub const AGENT_DISCONNECT: u8 = 102;
pub const ACK: u8 = 103;
pub const FLAG_FIN: u32 = 0x01;
/// The smallest frame size a HELLO may offer (`spoe.MIN_FRAME_SIZE`).
pub const MIN_FRAME_SIZE: u64 = 256;
/// A typed SPOP value (`spop.Value`).
pub enum Value {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Ipv4([u8; 4]),
    Ipv6([u8; 16]),
    Str(Vec<u8>),
    Bin(Vec<u8>),
}

/// A frame the agent cannot use: the DISCONNECT status that says why, and the message.
#[derive(Debug)]
pub struct SpopError {
    pub status: u64,
    pub message: String,
}

pub fn error(status: u64, message: impl Into<String>) -> SpopError {
    SpopError {
        status,
        message: message.into(),
    }
}

/// `spop.decode_varint`: HAProxy's variable-length integer at `data[at..]`, and the offset after it.
pub fn decode_varint(data: &[u8], at: usize) -> Result<(u64, usize), SpopError> {
    let ends = || error(4, "a frame ends inside a varint");
    let mut at = at;
    let first = *data.get(at).ok_or_else(ends)?;
    at += 1;
    if first < 240 {
        return Ok((first as u64, at));
    }
    let mut value = first as u128;
    let mut shift = 4u32;
    loop {
        let byte = *data.get(at).ok_or_else(ends)?;
        at += 1;
        value += (byte as u128) << shift;
        shift += 7;
        if byte < 128 {
            if value > u64::MAX as u128 {
                return Err(error(4, "a varint larger than 64 bits"));
            }
            return Ok((value as u64, at));
        }
        if shift > 64 {
            return Err(error(4, "a varint longer than 10 bytes"));
        }
    }
}

/// `spop.encode_varint`.
pub fn encode_varint(out: &mut Vec<u8>, value: u64) {
    if value < 240 {
        out.push(value as u8);
        return;
    }
    out.push((value | 0xF0) as u8);
    let mut value = (value - 240) >> 4;
    while value >= 128 {
        out.push((value | 0x80) as u8);
        value = (value - 128) >> 7;
    }
    out.push(value as u8);
}

pub fn string(data: &[u8], at: usize) -> Result<(&[u8], usize), SpopError> {
    let (length, at) = decode_varint(data, at)?;
    if length as u128 + at as u128 > data.len() as u128 {
        return Err(error(
            4,
            format!("a string of {length} bytes runs past the end of its frame"),
        ));
    }
    let end = at + length as usize;
    Ok((&data[at..end], end))
}

pub fn typed(data: &[u8], at: usize) -> Result<(Value, usize), SpopError> {
    let head = *data
        .get(at)
        .ok_or_else(|| error(4, "a frame ends before a value"))?;
    let kind = head & 0x0F;
    let at = at + 1;
    Ok(match kind {
        8 | 9 => {
            let (text, at) = string(data, at)?;
            let text = text.to_vec();
            (
                if kind == 8 {
                    Value::Str(text)
                } else {
                    Value::Bin(text)
                },
                at,
            )
        }
        3 | 5 => {
            let (value, at) = decode_varint(data, at)?;
            (Value::UInt(value), at)
        }
        2 => {
            let (value, at) = decode_varint(data, at)?;
            (Value::Int(value as u32 as i32 as i64), at)
        }
        4 => {
            let (value, at) = decode_varint(data, at)?;
            (Value::Int(value as i64), at)
        }
        1 => (Value::Bool(head & 0x10 != 0), at),
        0 => (Value::Null, at),
        6 => {
            let raw = data
                .get(at..at + 4)
                .ok_or_else(|| error(4, "a frame ends inside an IPv4 address"))?;
            (Value::Ipv4(raw.try_into().unwrap()), at + 4)
        }
        7 => {
            let raw = data
                .get(at..at + 16)
                .ok_or_else(|| error(4, "a frame ends inside an IPv6 address"))?;
            (Value::Ipv6(raw.try_into().unwrap()), at + 16)
        }
        _ => return Err(error(4, format!("unknown data type {kind}"))),
    })
}

/// A frame's header fields and the offset of its payload (`spop.read_frame`).
pub struct Frame {
    pub kind: u8,
    pub stream_id: u64,
    pub frame_id: u64,
    pub payload: usize,
}

pub fn read_frame(data: &[u8]) -> Result<Frame, SpopError> {
    if data.len() < 7 {
        return Err(error(
            4,
            format!("a frame of {} bytes is shorter than its header", data.len()),
        ));
    }
    let kind = data[0];
    let flags = u32::from_be_bytes(data[1..5].try_into().unwrap());
    let (stream_id, at) = decode_varint(data, 5)?;
    let (frame_id, at) = decode_varint(data, at)?;
    if flags & FLAG_FIN == 0 {
        return Err(error(10, "fragmented frames are not supported"));
    }
    Ok(Frame {
        kind,
        stream_id,
        frame_id,
        payload: at,
    })
}

pub fn lossy(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw).into_owned()
}

/// `spop.kv_list`: a HELLO or DISCONNECT payload, names and values in order.
pub fn kv_list(payload: &[u8]) -> Result<Vec<(String, Value)>, SpopError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < payload.len() {
        let (name, next) = string(payload, at)?;
        let (value, next) = typed(payload, next)?;
        out.push((lossy(name), value));
        at = next;
    }
    Ok(out)
}

/// Arguments of one message, in order (a repeated name: the last value, as a Python dict keeps it).
pub type Args = Vec<(String, Value)>;

/// `spoe._message`: the arguments of the first message called `name` of a NOTIFY payload; all of
/// it is read (malformed anywhere is status 4).
pub fn find_message(payload: &[u8], name: &str) -> Result<Option<Args>, SpopError> {
    let mut found = None;
    let mut at = 0;
    while at < payload.len() {
        let (message, next) = string(payload, at)?;
        at = next;
        let count = *payload
            .get(at)
            .ok_or_else(|| error(4, "a message ends before its argument count"))?;
        at += 1;
        let mut args = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let (arg, next) = string(payload, at)?;
            let (value, next) = typed(payload, next)?;
            args.push((lossy(arg), value));
            at = next;
        }
        if found.is_none() && lossy(message) == name {
            found = Some(args);
        }
    }
    Ok(found)
}

pub fn frame(kind: u8, stream_id: u64, frame_id: u64, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(payload.len() + 24);
    body.push(kind);
    body.extend_from_slice(&FLAG_FIN.to_be_bytes());
    encode_varint(&mut body, stream_id);
    encode_varint(&mut body, frame_id);
    body.extend_from_slice(payload);
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

pub fn put_string(out: &mut Vec<u8>, text: &str) {
    encode_varint(out, text.len() as u64);
    out.extend_from_slice(text.as_bytes());
}

pub fn put_typed_string(out: &mut Vec<u8>, text: &str) {
    out.push(8);
    put_string(out, text);
}

pub fn put_typed_uint(out: &mut Vec<u8>, value: u64) {
    out.push(if value < 1 << 32 { 3 } else { 5 });
    encode_varint(out, value);
}

/// `spop.agent_hello`: version 2.0, the agreed frame size, pipelining.
pub fn agent_hello(max_frame_size: u64) -> Vec<u8> {
    let mut payload = Vec::new();
    put_string(&mut payload, "version");
    put_typed_string(&mut payload, "2.0");
    put_string(&mut payload, "max-frame-size");
    put_typed_uint(&mut payload, max_frame_size);
    put_string(&mut payload, "capabilities");
    put_typed_string(&mut payload, "pipelining");
    frame(AGENT_HELLO, 0, 0, &payload)
}

/// `spop.agent_disconnect`.
pub fn agent_disconnect(status: u64, message: &str) -> Vec<u8> {
    let mut payload = Vec::new();
    put_string(&mut payload, "status-code");
    put_typed_uint(&mut payload, status);
    put_string(&mut payload, "message");
    put_typed_string(&mut payload, message);
    frame(AGENT_DISCONNECT, 0, 0, &payload)
}

/// `spop.ack`: the ACK of NOTIFY `(stream_id, frame_id)` carrying `actions`.
pub fn ack(stream_id: u64, frame_id: u64, actions: &[Vec<u8>]) -> Vec<u8> {
    frame(ACK, stream_id, frame_id, &actions.concat())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spop_hello::negotiate;

    #[test]
    fn varints_round_trip() {
        for value in [
            0u64,
            239,
            240,
            241,
            2287,
            2288,
            264431,
            264432,
            u32::MAX as u64,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            encode_varint(&mut out, value);
            assert_eq!(decode_varint(&out, 0).unwrap(), (value, out.len()));
        }
        assert_eq!(decode_varint(&[0xf0; 11], 0).unwrap_err().status, 4);
        assert_eq!(decode_varint(&[0xf0], 0).unwrap_err().status, 4);
    }

    /// xorshift64*: reproducible inputs without a crate.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// A valid NOTIFY frame's body (without its length) carrying `check` with a few arguments.
    fn notify_body(rng: &mut Rng) -> Vec<u8> {
        let mut payload = Vec::new();
        put_string(&mut payload, "check");
        payload.push(4);
        put_string(&mut payload, "method");
        put_typed_string(&mut payload, "GET");
        put_string(&mut payload, "uri");
        put_typed_string(&mut payload, &"/api/".repeat(1 + rng.below(20)));
        put_string(&mut payload, "n");
        put_typed_uint(&mut payload, rng.next());
        put_string(&mut payload, "ip");
        payload.push(6);
        payload.extend_from_slice(&[127, 0, 0, 1]);
        frame(NOTIFY, rng.next() >> 40, rng.next() >> 40, &payload)[4..].to_vec()
    }

    /// Mutated and random frames: every decode ends in a value or a `SpopError` with a status,
    /// never a panic, and no decoded string is longer than the frame that carried it.
    #[test]
    fn generated_frames_never_panic() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut refused = 0;
        for round in 0..20_000 {
            let mut body = notify_body(&mut rng);
            match round % 4 {
                0 => {
                    for _ in 0..1 + rng.below(8) {
                        let at = rng.below(body.len());
                        body[at] = rng.next() as u8;
                    }
                }
                1 => body.truncate(rng.below(body.len())),
                2 => {
                    let at = rng.below(body.len());
                    body.insert(at, 0xF0 | rng.next() as u8);
                }
                _ => body = (0..rng.below(64)).map(|_| rng.next() as u8).collect(),
            }
            let decoded = read_frame(&body).and_then(|frame| {
                let payload = &body[frame.payload..];
                let hello = kv_list(payload).map(|_| ());
                let message = find_message(payload, "check").map(|args| {
                    for (name, value) in args.unwrap_or_default() {
                        assert!(name.len() <= body.len());
                        if let Value::Str(raw) | Value::Bin(raw) = value {
                            assert!(raw.len() <= body.len());
                        }
                    }
                });
                let _ = negotiate(payload, 16380);
                hello.or(message)
            });
            if let Err(error) = decoded {
                assert!(
                    matches!(error.status, 3 | 4 | 10),
                    "status {}",
                    error.status
                );
                assert!(!error.message.is_empty());
                refused += 1;
            }
        }
        assert!(
            refused > 1000,
            "the mutations should be refused often: {refused}"
        );
    }
}
