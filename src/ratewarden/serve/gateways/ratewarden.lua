-- ratewarden for HAProxy 2.6+ (Lua with core.httpclient): asks `ratewarden serve` about each request.
--
-- haproxy.cfg loads this file and calls it first in a frontend:
--
--   global
--       lua-load-per-thread ratewarden.lua
--   frontend api
--       http-request lua.ratewarden_check http://127.0.0.1:8080/check closed
--
-- The first argument is the service's check URL, the second what to do when the service gives no
-- answer (refused, reset, timed out: HAProxy's HTTP client then makes up a 5xx): "closed" answers
-- 503 problem+json with Retry-After: 1 (the default), "open" lets the request through unchecked.
--
-- Allowed (2xx): the request goes on; the rate-limit headers of the answer are kept in the
-- variables txn.rw_ratelimit, txn.rw_ratelimit_policy, txn.rw_x_ratelimit_limit,
-- txn.rw_x_ratelimit_remaining and txn.rw_x_ratelimit_reset, which haproxy.cfg adds to the
-- response. Any other answer (429 limited, 403 banned, 503 store down under a closed policy) is
-- returned to the client as the service gave it: status, headers and body.

local TIMEOUT_MS = 1000  -- the whole check: connect, send, answer

-- Client headers not forwarded to the check: hop-by-hop ones, those describing the client's body
-- (the check is sent without one), and those describing the request, which are HAProxy's (a
-- client's own would be believed).
local SKIP = {
    ["connection"] = true, ["keep-alive"] = true, ["proxy-connection"] = true, ["te"] = true,
    ["trailer"] = true, ["transfer-encoding"] = true, ["upgrade"] = true, ["content-length"] = true,
    ["expect"] = true, ["x-original-method"] = true, ["x-original-uri"] = true, ["x-real-ip"] = true,
    ["x-forwarded-for"] = true, ["x-forwarded-proto"] = true, ["x-forwarded-method"] = true,
    ["x-forwarded-uri"] = true, ["forwarded"] = true,
}

-- The answer's headers kept for an allowed request, and the variable each goes to.
local KEEP = {
    ["ratelimit"] = "txn.rw_ratelimit",
    ["ratelimit-policy"] = "txn.rw_ratelimit_policy",
    ["x-ratelimit-limit"] = "txn.rw_x_ratelimit_limit",
    ["x-ratelimit-remaining"] = "txn.rw_x_ratelimit_remaining",
    ["x-ratelimit-reset"] = "txn.rw_x_ratelimit_reset",
}

-- Headers of the service's own answer not copied into a denial (HAProxy frames the reply itself).
local FRAMING = {
    ["connection"] = true, ["keep-alive"] = true, ["transfer-encoding"] = true, ["content-length"] = true,
    ["date"] = true, ["server"] = true,
}

local UNAVAILABLE = '{"type":"about:blank","title":"Service Unavailable","status":503,'
    .. '"detail":"the rate limit service did not answer"}\n'

-- Header values as a Lua list (HAProxy's header tables count from 0).
local function values(list)
    local out = { list[0] }
    for _, v in ipairs(list) do
        out[#out + 1] = v
    end
    return out
end

-- One header's values, joined as HTTP joins repeated headers.
local function joined(list)
    if list[1] == nil then
        return list[0]
    end
    return table.concat(values(list), ", ")
end

-- Whether a 5xx answer is the service's own (problem+json: a store outage under a closed
-- policy), not one HAProxy's HTTP client made up after failing to reach it.
local function from_service(answer)
    local list = answer.headers and answer.headers["content-type"]
    return list ~= nil and string.find(list[0] or "", "application/problem+json", 1, true) ~= nil
end

local function check(txn, url, on_failure)
    -- The client's headers as HAProxy gives them (a fresh table), minus SKIP, plus the request's
    -- own description.
    local headers = txn.http:req_get_headers()
    for name in pairs(SKIP) do
        headers[name] = nil
    end
    local client = txn.f:src()
    local tls = txn.f:ssl_fc()  -- a boolean fetch: Lua gets 0 or 1 (0 is true in Lua)
    headers["x-original-method"] = { txn.f:method() }
    headers["x-original-uri"] = { txn.f:url() }
    headers["x-real-ip"] = { client }
    headers["x-forwarded-for"] = { client }
    headers["x-forwarded-proto"] = { (tls == true or tls == 1) and "https" or "http" }

    local http = core.httpclient()
    local ok, answer = pcall(http.get, http, { url = url, headers = headers, timeout = TIMEOUT_MS })
    local status = ok and answer and tonumber(answer.status) or 0

    if status >= 200 and status < 300 then
        local got = answer.headers
        if got then
            for name, var in pairs(KEEP) do
                local list = got[name]
                if list then
                    txn:set_var(var, joined(list))
                end
            end
        end
        return
    end

    if status == 0 or (status >= 500 and not from_service(answer)) then  -- no answer from the service
        if on_failure == "open" then
            return
        end
        txn:done{
            status = 503,
            headers = { ["content-type"] = { "application/problem+json" }, ["retry-after"] = { "1" } },
            body = UNAVAILABLE,
        }
        return
    end

    local reply = txn:reply{ status = status }
    for name, list in pairs(answer.headers or {}) do
        if not FRAMING[name] then
            for _, v in ipairs(values(list)) do
                reply:add_header(name, v)
            end
        end
    end
    reply:set_body(answer.body or "")
    txn:done(reply)
end

core.register_action("ratewarden_check", { "http-req" }, function(txn, url, on_failure)
    check(txn, url, on_failure or "closed")
end, 2)
