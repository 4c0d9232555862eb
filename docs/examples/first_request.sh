curl -s 127.0.0.1:8000/v2/models/mlp                       # the model's metadata
python3 -c "import json; print(json.dumps({'inputs': [{'name': 'image', 'datatype': 'FP32', 'shape': [1, 784], 'data': [0.5] * 784}]}))" > req.json
curl -s -X POST 127.0.0.1:8000/v2/models/mlp/infer -d @req.json
.venv/bin/python -c "import numpy as np; np.save('x.npy', np.zeros(784, np.float32))"
.venv/bin/adaserve infer mlp --input x.npy --url 127.0.0.1:8000               # the outputs and their argmax
.venv/bin/adaserve infer mlp --input x.npy --url 127.0.0.1:8000 --classes 3   # the 3 likeliest classes, named
.venv/bin/adaserve models list                                                # what the repository holds
