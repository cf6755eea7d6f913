"""The engine shared by the simulator, the executor and the server: requests, the scheduler and
its parts (queues, batching policies, eviction), KV blocks and the prefix cache, the step."""
