-- ratewarden: one all-or-nothing check of several limits, each with its own algorithm.
-- Every algorithm below reproduces src/ratewarden/algorithms/*.py operation for operation
-- (same formulas, same order, same epsilons) so that doubles come out bit-identical.
--
-- KEYS[i]      storage key of limit i
-- ARGV[1]      "h" = charge all or nothing and return the deciding decision,
--              "p" = peek: charge nothing, return every limit's decision,
--              "a" = adjust: apply each cost as a refund (< 0) or penalty (>= 0) that never
--                    denies, as ratewarden.charges.adjusted_state does; every limit's decision
-- ARGV[2]      the clock: "" = the server clock (TIME); a negative number -d = the server
--              clock, and if it is past d (the caller's deadline, seconds, server time) the
--              script does nothing and replies an error; a number >= 0 = now (tests only)
-- ARGV[3+6(i-1) ..] per limit: algorithm id, limit, period, capacity (burst), debt, cost
--   ids: 1 fixed_window, 2 sliding_window, 3 sliding_log, 4 token_bucket,
--        5 token_bucket_debt, 6 leaky_bucket, 7 gcra
-- State: a string of space-separated %.17g numbers (lossless doubles), except sliding_log,
-- which is a list of timestamps. Every written key expires after reset_after (ceil ms, >= 1).
-- Reply ("h"): {allowed 1/0, limit, remaining, reset_after, retry_after, index}, floats as strings.
-- Reply ("p", "a"): those first five fields for every limit, in order.

local mode = ARGV[1]
local clock = tonumber(ARGV[2])
local now
if clock and clock >= 0 then
  now = clock
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
  -- Run after the caller stopped waiting (e.g. queued while the server was paused): the caller
  -- already reported a failure, so charge nothing.
  if clock and now > -clock then
    return redis.error_reply('ratewarden: expired, the caller stopped waiting before this check ran')
  end
end

-- The most common call, one fixed window checked ("h") whose state is absent or of the current
-- window, is answered here, before the rest of the script defines its locals and functions (that
-- costs half of a call's time; the locals alone, 6 % of Redis's CPU for the call). The arithmetic
-- is fixed_window's below, line for line (trunc is floor here: what is left is never negative, or
-- is floored to 0); any other state (an older or a later window, a clock stepped back) and a cost
-- over the limit go on to it.
if mode == 'h' and #KEYS == 1 and ARGV[3] == '1' then
  local find, sub, fmt = string.find, string.sub, string.format
  local limit, period, cost = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[8])
  local start = math.floor(now / period) * period
  local st = redis.call('GET', KEYS[1])
  local count = 0
  if st then
    local j = find(st, ' ', 1, true)
    if j and tonumber(sub(st, 1, j - 1)) == start then count = tonumber(sub(st, j + 1)) else count = nil end
  end
  if count and cost <= limit then
    local reset_after = start + period - now
    local total = count + cost
    if total <= limit then
      -- integers (the usual state) print alike either way, and faster with %d
      local state = (start % 1 == 0 and total % 1 == 0 and total < 1e15) and fmt('%d %d', start, total)
        or fmt('%.17g %.17g', start, total)
      redis.call('PSETEX', KEYS[1], math.max(1, math.ceil(reset_after * 1000)), state)
      return {1, limit, math.floor(limit - total), reset_after == 0 and '0' or fmt('%.17g', reset_after), '0', 0}
    end
    local left = reset_after == 0 and '0' or fmt('%.17g', reset_after)
    return {0, limit, math.max(0, math.floor(limit - count)), left, left, 0}
  end
end

local INF = 1 / 0
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
local abs, frexp, ldexp = math.abs, math.frexp, math.ldexp
local tonumber, fmt, find, sub = tonumber, string.format, string.find, string.sub

local function f(x) if x == 0 then return '0' end return fmt('%.17g', x) end
local function trunc(x) if x >= 0 then return floor(x) end return ceil(x) end
-- floor(a / b) of integer-valued doubles below 2^53, b > 0, exactly (Python's a // b): the
-- rounded quotient is floor(a / b) or one more, which the exact product a / b * b shows.
local function idiv(a, b)
  local r = floor(a / b)
  if r * b > a then return r - 1 end
  return r
end
local function nums(s)  -- plain find/sub: cheaper than gmatch on this hot path
  local out, n, i = {}, 0, 1
  while true do
    local j = find(s, ' ', i, true)
    n = n + 1
    if not j then
      out[n] = tonumber(sub(s, i))
      return out
    end
    out[n] = tonumber(sub(s, i, j - 1))
    i = j + 1
  end
end

-- Each returns allowed, limit, remaining, reset_after, retry_after, new state (string or nil).

-- A clock reading older than a key's state (read before another check wrote it) is taken as the
-- state's own time: state only moves forward (the Python algorithms do the same). A state more
-- than a period ahead of the clock is no late reading but a clock stepped back: it is dropped and
-- the key counts from now (algorithms/base.py clock_stepped_back), with a warning in the Redis log.

-- Late readings are bounded by store deadlines and scheduling: seconds at worst. A state is taken
-- for a clock stepped back only when it is ahead by more than its period and STEP_BACK seconds.
local STEP_BACK = 30
local warned = false
local function stepped_back(ahead, period)
  if not warned then
    warned = true
    redis.log(redis.LOG_WARNING, fmt('ratewarden: a rate-limit state is %.3f s ahead of the clock ' ..
      '(more than its period, %g s): the clock stepped back; its keys count again from now', ahead, period))
  end
end

-- The start of the window a window state (fixed_window, sliding_window) begun at `at` counts in:
-- `at`, when it is the current window or a later one (a clock reading older than the state); nil
-- when it is older, or more than a period ahead (the clock stepped back).
local function live_window(at, start, period)
  if at == start then return at end
  if at - now > math.max(period, STEP_BACK) then
    stepped_back(at - now, period)
    return nil
  end
  if at > start then return at end
  return nil
end

local function fixed_window(st, cost, limit, period)
  local now = now
  local start = floor(now / period) * period
  local count = 0
  if st then
    local s = nums(st)
    local at = live_window(s[1], start, period)
    if at then
      if at > start then start, now = at, at end
      count = s[2]
    end
  end
  local reset_after = start + period - now
  local total = count + cost
  if total <= limit then
    return true, limit, trunc(limit - total), reset_after, 0, fmt('%.17g %.17g', start, total)
  end
  local retry = reset_after
  if cost > limit then retry = INF end
  return false, limit, max(0, trunc(limit - count)), reset_after, retry, nil
end

local function sliding_window(st, cost, limit, period)
  local now = now
  local start = floor(now / period) * period
  local current, previous = 0, 0
  if st then
    local s = nums(st)
    if s[1] == start - period then
      previous = s[2]
    else
      local at = live_window(s[1], start, period)
      if at then
        if at > start then start, now = at, at end
        current, previous = s[2], s[3]
      end
    end
  end
  local elapsed = now - start
  local weight = 1.0 - elapsed / period
  local used = previous * weight + current
  local reset_after
  if used + cost <= limit + 1e-9 then
    current = current + cost
    used = used + cost
    if current > 0 then
      reset_after = start + 2 * period - now
    elseif previous > 0 then
      reset_after = start + period - now
    else
      reset_after = 0
    end
    return true, limit, trunc(limit - used + 1e-9), reset_after, 0,
      fmt('%.17g %.17g %.17g', start, current, previous)
  end
  if current > 0 then
    reset_after = start + 2 * period - now
  else
    reset_after = start + period - now
  end
  local retry
  if cost > limit then
    retry = INF
  else
    local room = limit - current - cost
    if room >= 0 and previous > 0 then
      retry = period * (1.0 - room / previous) - elapsed
    elseif current > 0 then
      retry = (start + period - now) + period * (1.0 - (limit - cost) / current)
    else
      retry = start + period - now
    end
    retry = max(retry, 0)
  end
  return false, limit, max(0, trunc(limit - used + 1e-9)), reset_after, retry, nil
end

-- Sliding log on a list: entries before `first` (0-based) have left the window.
-- The "state" returned is the index of the first live entry, used by the write phase.
local log_at = {}  -- by key: the time sliding_log ran at, its new stamps' time

local function sliding_log(key, cost, limit, period)
  local now = now
  local n = redis.call('LLEN', key)
  local last = nil
  if n > 0 then
    last = tonumber(redis.call('LINDEX', key, -1))
    if last - now > math.max(period, STEP_BACK) then
      stepped_back(last - now, period)
    elseif last > now then
      now = last
    end
  end
  log_at[key] = now
  local horizon = now - period
  local first = 0
  if last and last - now > math.max(period, STEP_BACK) then first = n end  -- stale: every stamp goes
  while first < n and tonumber(redis.call('LINDEX', key, first)) <= horizon do first = first + 1 end
  local used = n - first
  local units = ceil(cost)
  if used == 0 then last = nil end
  if used + units <= limit then
    if units > 0 then last = now end
    local reset_after = 0
    if last then reset_after = last + period - now end
    return true, limit, limit - (used + units), reset_after, 0, first
  end
  local reset_after = 0
  if last then reset_after = last + period - now end
  local retry
  if units > limit then
    retry = INF
  else
    retry = tonumber(redis.call('LINDEX', key, first + used + units - limit - 1)) + period - now
  end
  return false, limit, max(0, limit - used), reset_after, retry, nil
end

-- A bucket's state (value, time of the value), or nil: none, or more than a period ahead of the
-- clock (stepped back).
local function timed_state(st, period)
  local s = st and nums(st)
  if s and s[2] - now > math.max(period, STEP_BACK) then
    stepped_back(s[2] - now, period)
    return nil
  end
  return s
end

-- token_bucket_debt, and token_bucket as its debt 0 (algorithms/token_bucket*.py): with no debt
-- the request needs its whole cost, and the balance never goes below 0 for the max(0, ...) to clip.
local function token_bucket(st, cost, capacity, per_second, debt, period)
  local now = now
  local tokens
  local s = timed_state(st, period)
  if s then
    if s[2] > now then now = s[2] end
    tokens = min(capacity, s[1] + (now - s[2]) * per_second)
  else
    tokens = capacity
  end
  local needed = max(min(cost, 1.0), cost - debt)
  if tokens + 1e-9 >= needed then
    tokens = tokens - cost
    return true, capacity, max(0, trunc(tokens + 1e-9)), (capacity - tokens) / per_second, 0,
      fmt('%.17g %.17g', tokens, now)
  end
  local retry = INF
  if needed <= capacity then retry = (needed - tokens) / per_second end
  return false, capacity, max(0, trunc(tokens + 1e-9)), (capacity - tokens) / per_second, retry, nil
end

local function leaky_bucket(st, cost, capacity, per_second, period)
  local now = now
  local level = 0
  local s = timed_state(st, period)
  if s then
    if s[2] > now then now = s[2] end
    level = max(0, s[1] - (now - s[2]) * per_second)
  end
  if level + cost <= capacity + 1e-9 then
    level = level + cost
    return true, capacity, trunc(capacity - level + 1e-9), level / per_second, 0, fmt('%.17g %.17g', level, now)
  end
  local retry = INF
  if cost <= capacity then retry = (level + cost - capacity) / per_second end
  return false, capacity, trunc(capacity - level + 1e-9), level / per_second, retry, nil
end

-- Exact: every time in whole steps of the grid q, the float step of |now| + B T (doubled when
-- the TATs could reach 2^53 steps): the same integer-valued doubles below 2^53 as the Python ints
-- of algorithms/gcra.py (see there), so the answers are identical.
local function gcra(st, cost, burst, interval, period)
  local _, e = frexp(abs(now) + burst * interval)
  local q = ldexp(1, e - 53)
  local step = ceil(interval / q)  -- T, rounded up: the rate is never exceeded
  local start = floor(now / q)  -- divisions by a power of two are exact
  if start + burst * step >= 9007199254740992 then
    q = q * 2
    step = ceil(interval / q)
    start = floor(now / q)
  end
  local window = burst * step
  local ahead = 0
  if st then
    local tat = ceil(tonumber(st) / q)
    if tat > start then
      ahead = tat - start
      if (ahead - window) * q > math.max(period, STEP_BACK) then  -- past B*T + period: the clock stepped back
        stepped_back((ahead - window) * q, period)
        ahead = 0
      end
    end
  end
  local used = ahead + ceil(cost * step)
  if used <= window then
    return true, burst, idiv(window - used, step), used * q, 0, f((start + used) * q)
  end
  local retry = INF
  if cost <= burst then retry = (used - window) * q end
  return false, burst, max(0, idiv(window - ahead, step)), ahead * q, retry, nil
end

local function run(algo, b, key, st, cost)
  local limit, period = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local capacity = tonumber(ARGV[b + 4])
  if algo == 1 then
    return fixed_window(st, cost, limit, period)
  elseif algo == 2 then
    return sliding_window(st, cost, limit, period)
  elseif algo == 3 then
    return sliding_log(key, cost, limit, period)
  elseif algo == 4 then
    return token_bucket(st, cost, capacity, limit / period, 0, period)
  elseif algo == 5 then
    return token_bucket(st, cost, capacity, limit / period, tonumber(ARGV[b + 5]), period)
  elseif algo == 6 then
    return leaky_bucket(st, cost, capacity, limit / period, period)
  elseif algo == 7 then
    return gcra(st, cost, capacity, period / limit, period)
  end
  return nil
end

local function ttl_of(reset_after) return max(1, ceil(reset_after * 1000)) end

-- Sliding log write: drop the entries before `first`, append `units` stamps of now.
local function store_log(key, first, units, ttl)
  if first > 0 then redis.call('LTRIM', key, first, -1) end
  if units > 0 then
    local stamp = f(log_at[key] or now)
    for _ = 1, units do redis.call('RPUSH', key, stamp) end
  end
  redis.call('PEXPIRE', key, ttl)
end

local nkeys = #KEYS

-- Adjust: each key on its own, never denying (ratewarden.charges.adjusted_state).
-- A penalty charges what fits when the whole amount does not, so the key ends exhausted;
-- a refund that leaves the whole limit available deletes the key.
if mode == 'a' then
  local out = {}
  for i = 1, nkeys do
    local b = 2 + 6 * (i - 1)
    local algo = tonumber(ARGV[b + 1])
    local amount = tonumber(ARGV[b + 6])
    local key = KEYS[i]
    local a, l, r, s, t, n
    local st = nil
    if algo ~= 3 then
      st = redis.call('GET', key)
      if not st then st = nil end
    end
    if amount >= 0 then
      a, l, r, s, t, n = run(algo, b, key, st, amount)
      if a == nil then return redis.error_reply('ratewarden: unknown algorithm id ' .. tostring(ARGV[b + 1])) end
      if not a and r > 0 then
        amount = r
        a, l, r, s, t, n = run(algo, b, key, st, amount)
      end
      if not a then
        a, l, r, s, t, n = run(algo, b, key, st, 0)
      elseif algo == 3 then
        store_log(key, n, ceil(amount), ttl_of(s))
      else
        redis.call('SET', key, n, 'PX', ttl_of(s))
      end
    elseif (algo == 3 and redis.call('LLEN', key) == 0) or (algo ~= 3 and not st) then
      a, l, r, s, t, n = run(algo, b, key, nil, 0)
      if a == nil then return redis.error_reply('ratewarden: unknown algorithm id ' .. tostring(ARGV[b + 1])) end
    else
      if algo == 3 then
        redis.call('LTRIM', key, 0, -ceil(-amount) - 1)  -- one stamp per unit: drop the newest
        a, l, r, s, t, n = run(algo, b, key, nil, 0)
      elseif algo == 5 then
        -- Plain arithmetic: the admission rule (a whole token) must not refuse a refund in debt.
        local capacity = tonumber(ARGV[b + 4])
        local per_second = tonumber(ARGV[b + 2]) / tonumber(ARGV[b + 3])
        local v = nums(st)
        local at = max(now, v[2])  -- never move the last update back
        local tokens = min(capacity, v[1] + (at - v[2]) * per_second)
        n = fmt('%.17g %.17g', min(capacity, tokens - amount), at)
        a, l, r, s, t = run(algo, b, key, n, 0)
      else
        a, l, r, s, t, n = run(algo, b, key, st, amount)
        if a == nil then return redis.error_reply('ratewarden: unknown algorithm id ' .. tostring(ARGV[b + 1])) end
        if n and algo == 2 then
          local v = nums(n)
          if v[2] < 0 then
            n = f(v[1]) .. ' 0 ' .. f(v[3])
            a, l, r, s, t = run(algo, b, key, n, 0)
          end
        end
      end
      if n == nil or r >= l then
        redis.call('DEL', key)
        a, l, r, s, t, n = run(algo, b, key, nil, 0)
      elseif algo == 3 then
        store_log(key, n, 0, ttl_of(s))
      else
        redis.call('SET', key, n, 'PX', ttl_of(s))
      end
    end
    local j = 5 * (i - 1)
    out[j + 1] = a and 1 or 0
    out[j + 2] = l
    out[j + 3] = r
    out[j + 4] = f(s)
    out[j + 5] = f(t)
  end
  return out
end

-- The common case, one limit: no per-limit tables, straight to the reply.
if nkeys == 1 and mode == 'h' then
  local algo = tonumber(ARGV[3])
  local key = KEYS[1]
  local st = nil
  if algo ~= 3 then
    st = redis.call('GET', key)
    if not st then st = nil end
  end
  local a, l, r, s, t, n = run(algo, 2, key, st, tonumber(ARGV[8]))
  if a == nil then
    return redis.error_reply('ratewarden: unknown algorithm id ' .. tostring(ARGV[3]))
  end
  if a then
    if algo == 3 then
      store_log(key, n, ceil(tonumber(ARGV[8])), ttl_of(s))
    else
      redis.call('SET', key, n, 'PX', ttl_of(s))
    end
  end
  return {a and 1 or 0, l, r, f(s), f(t), 0}
end

local ok, lim, rem, rst, rty, new = {}, {}, {}, {}, {}, {}
local all = true
for i = 1, nkeys do
  local b = 2 + 6 * (i - 1)
  local algo = tonumber(ARGV[b + 1])
  local cost = tonumber(ARGV[b + 6])
  local key = KEYS[i]
  local st = nil
  if algo ~= 3 then
    st = redis.call('GET', key)
    if not st then st = nil end
  end
  local a, l, r, s, t, n = run(algo, b, key, st, cost)
  if a == nil then
    return redis.error_reply('ratewarden: unknown algorithm id ' .. tostring(ARGV[b + 1]))
  end
  ok[i], lim[i], rem[i], rst[i], rty[i], new[i] = a, l, r, s, t, n
  all = all and a
end

if mode == 'p' then
  local out = {}
  for i = 1, nkeys do
    local j = 5 * (i - 1)
    out[j + 1] = ok[i] and 1 or 0
    out[j + 2] = lim[i]
    out[j + 3] = rem[i]
    out[j + 4] = f(rst[i])
    out[j + 5] = f(rty[i])
  end
  return out
end

if all then
  for i = 1, nkeys do
    local key = KEYS[i]
    local ttl = ttl_of(rst[i])
    if tonumber(ARGV[2 + 6 * (i - 1) + 1]) == 3 then
      store_log(key, new[i], ceil(tonumber(ARGV[2 + 6 * i])), ttl)
    else
      redis.call('SET', key, new[i], 'PX', ttl)
    end
  end
end

-- The deciding limit, as ratewarden.stores.base.combine picks it.
local idx = 1
if nkeys > 1 then
  if all then
    for i = 2, nkeys do
      if rem[i] < rem[idx] or (rem[i] == rem[idx] and rst[i] > rst[idx]) then idx = i end
    end
  else
    idx = nil
    for i = 1, nkeys do
      if not ok[i] and (idx == nil or rty[i] > rty[idx]) then idx = i end
    end
  end
end
return {ok[idx] and 1 or 0, lim[idx], rem[idx], f(rst[idx]), f(rty[idx]), idx - 1}
