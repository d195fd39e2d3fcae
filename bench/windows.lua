-- wrk's script for bench/windows.py: each request's latency, counted in the window of a
-- schedule in which the request began. One connection a thread (wrk -tN -cN), so that in each
-- thread a request is answered before the next is made and its time is the answer's time less
-- the request's. Times are CLOCK_MONOTONIC's, the clock the daemon's time.monotonic() reads.
--
-- The schedule file (its path the script's one argument): the first window's start, a
-- window's width and its guard (seconds), then each window's arm (an integer). A request that
-- began before the first window, after the last, or within the guard at a window's start is
-- not counted.
--
-- Printed at the end, a line for each window and latency bucket of 10 us: "W <window *
-- 100000 + bucket> <requests>" (a bucket of 1 s or more is 99999), and for each window's
-- answers other than 200, "W <-(window + 1)> <answers>".

local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } patroller_bench_timespec;
int clock_gettime(int clk_id, patroller_bench_timespec *tp);
]]
local CLOCK_MONOTONIC = 1
local spec = ffi.new("patroller_bench_timespec")

local function now()
  ffi.C.clock_gettime(CLOCK_MONOTONIC, spec)
  return tonumber(spec.tv_sec) + tonumber(spec.tv_nsec) * 1e-9
end

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  local f = assert(io.open(args[1], "r"))
  start = f:read("*n")
  width = f:read("*n")
  guard = f:read("*n")
  windows = 0
  while f:read("*n") ~= nil do
    windows = windows + 1
  end
  f:close()
  seen = {}
  began = nil
  made = wrk.format()
end

function request()
  began = now()
  return made
end

function response(status, headers, body)
  local ended = now()
  local at = began - start
  local window = math.floor(at / width)
  if window < 0 or window >= windows or at - window * width < guard then
    return
  end
  local key
  if status ~= 200 then
    key = -(window + 1)
  else
    local bucket = math.floor((ended - began) * 1e5)
    if bucket > 99999 then
      bucket = 99999
    end
    key = window * 100000 + bucket
  end
  seen[key] = (seen[key] or 0) + 1
end

function done(summary, latency, requests)
  local total = {}
  for _, thread in ipairs(threads) do
    for key, count in pairs(thread:get("seen")) do
      total[key] = (total[key] or 0) + count
    end
  end
  for key, count in pairs(total) do
    io.write(string.format("W %d %d\n", key, count))
  end
end
