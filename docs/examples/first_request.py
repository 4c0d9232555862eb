import numpy as np
import tritonclient.grpc as grpcclient

with grpcclient.InferenceServerClient("127.0.0.1:8001") as client:
    image = np.random.rand(4, 1, 28, 28).astype(np.float32)  # a batch of 4 Fashion-MNIST-sized images
    tensor = grpcclient.InferInput("image", list(image.shape), "FP32")
    tensor.set_data_from_numpy(image)
    result = client.infer("cnn", [tensor], parameters={"latency_ms": 20})  # per-request parameters travel along
    print(result.as_numpy("logits").argmax(axis=1))
