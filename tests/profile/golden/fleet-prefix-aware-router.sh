# router: NVIDIA Dynamo KV router (dynamo.frontend) (dynamo components/frontend (--router-mode kv), docs/design_docs/router_design.md)
# Dynamo's KV router needs KV events: start each engine as `python -m dynamo.vllm --model MODEL` with the engine flags above instead of `vllm serve` (Dynamo registers its workers itself; no backend list)
python -m dynamo.frontend \
    --http-port 8080 \
    --router-mode kv \
    --kv-overlap-score-weight 1.5 \
    --router-temperature 0 \
    --kv-cache-block-size 16
