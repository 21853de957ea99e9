"""The Python client of the three services: typed options, event iterators, retries and reconnecting watches.

    from diffusion_client import Inference, Training

    inference = Inference("127.0.0.1:50052")
    inference.load_model("z", "models/tiny-zimage")
    generation = inference.generate("z", "a lighthouse at dusk", seeds=[1, 2])
    generation.save("out")                      # out/z-1.png, out/z-2.png

The raw stubs stay available (`Inference.stub`) for anything this does not wrap.
"""
from diffusion_client.errors import ClientError
from diffusion_client.inference import Generation, Inference
from diffusion_client.training import Training
from diffusion_client.broker import Broker
from diffusion_client.options import Connection

__all__ = ["Broker", "ClientError", "Connection", "Generation", "Inference", "Training"]
