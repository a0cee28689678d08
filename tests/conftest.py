import torch

# Tests use tiny models: one thread avoids oversubscription on a shared 2-core machine and keeps runs stable.
torch.set_num_threads(1)
