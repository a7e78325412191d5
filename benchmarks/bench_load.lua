-- wrk script for benchmarks/bench_load.py: POSTs the JSON bodies of a file (one per line)
-- in turn, stops each thread after a number of requests (the run is also bounded by -d),
-- and writes the summary as JSON to $CFMAPS_WRK_OUT.
--
--   wrk -t1 -c8 -d60s -s bench_load.lua URL -- BODIES_FILE PATH MAX_REQUESTS_PER_THREAD

local requests = {}
local i = 0
local n = 0
local max_requests = 0

init = function(args)
  local path = args[2]
  max_requests = tonumber(args[3])
  local headers = { ["Content-Type"] = "application/json" }
  for line in io.lines(args[1]) do
    requests[#requests + 1] = wrk.format("POST", path, headers, line)
  end
  -- threads start at different bodies
  i = math.random(#requests) - 1
end

request = function()
  n = n + 1
  if n > max_requests then
    wrk.thread:stop()
  end
  i = i % #requests + 1
  return requests[i]
end

done = function(summary, latency, requests)
  local e = summary.errors
  local out = io.open(os.getenv("CFMAPS_WRK_OUT"), "w")
  out:write(string.format(
    '{"requests": %d, "duration_us": %d, "bytes": %d, "connect": %d, "read": %d, ' ..
    '"write": %d, "status": %d, "timeout": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, ' ..
    '"max_us": %d, "mean_us": %f}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.max, latency.mean))
  out:close()
end
