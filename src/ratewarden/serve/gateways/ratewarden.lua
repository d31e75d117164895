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

-- Header values as a Lua list, whatever the first index (HAProxy's request headers count from 0).
local function values(list)
    local out = {}
    local i = 0
    if list[0] ~= nil then
        out[1] = list[0]
    end
    for _, v in ipairs(list) do
        out[#out + 1] = v
    end
    return out
end

-- Whether a 5xx answer is the service's own (problem+json: a store outage under a closed
-- policy), not one HAProxy's HTTP client made up after failing to reach it.
local function from_service(answer)
    for name, list in pairs(answer.headers or {}) do
        if string.lower(name) == "content-type" then
            return string.find(values(list)[1] or "", "application/problem+json", 1, true) ~= nil
        end
    end
    return false
end

local function check(txn, url, on_failure)
    local headers = {}
    for name, list in pairs(txn.http:req_get_headers()) do
        if not SKIP[name] then
            headers[name] = values(list)
        end
    end
    local client = txn.f:src()
    local tls = txn.f:ssl_fc()  -- a boolean fetch: Lua gets 0 or 1 (0 is true in Lua)
    headers["x-original-method"] = { txn.f:method() }
    headers["x-original-uri"] = { txn.f:url() }
    headers["x-real-ip"] = { client }
    headers["x-forwarded-for"] = { client }
    headers["x-forwarded-proto"] = { (tls == true or tls == 1) and "https" or "http" }

    local ok, answer = pcall(function()
        return core.httpclient():get{ url = url, headers = headers, timeout = TIMEOUT_MS }
    end)
    local status = ok and answer and tonumber(answer.status) or 0

    if status >= 200 and status < 300 then
        for name, list in pairs(answer.headers or {}) do
            local var = KEEP[string.lower(name)]
            if var then
                txn:set_var(var, table.concat(values(list), ", "))
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
        if not FRAMING[string.lower(name)] then
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
