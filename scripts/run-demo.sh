#!/usr/bin/env bash
# make run: the main job on the bundled model. Until the server lands it inspects the model.
set -euo pipefail
bin=$1
model=$2
"$bin" inspect --model "$model"
