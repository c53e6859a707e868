"""A custom training loop: ``strategy.run(train_step)`` and ``strategy.reduce``, as in TF's guide.

Run it as ``mpirun -n 2 python examples/custom_loop.py`` (or plain ``python``).
``hd.nn.value_and_grad`` stands in for ``tf.GradientTape``: it runs the model
forward, the loss, and the layers' backward passes, and returns the loss and
the gradients of ``model.trainable_variables``.
"""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits

import hpcdist as hd
from hpcdist.nn import Dense, Sequential

GLOBAL_BATCH_SIZE = 64
EPOCHS = 10


def main() -> None:
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    strategy = hd.MultiWorkerMirroredStrategy()
    dataset = hd.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=0)
    dist_dataset = strategy.experimental_distribute_dataset(dataset.batch(GLOBAL_BATCH_SIZE))

    with strategy.scope():
        model = Sequential([Dense(64, activation="relu", input_shape=(64,)), Dense(10)])
        optimizer = hd.optimizers.SGD(learning_rate=0.1, momentum=0.9)
        loss_object = hd.nn.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=hd.nn.losses.Reduction.NONE
        )
        train_accuracy = hd.nn.metrics.SparseCategoricalAccuracy(name="train_accuracy")

        def compute_loss(labels, predictions):
            per_example_loss = loss_object(labels, predictions)
            return hd.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH_SIZE)

    grad_fn = hd.nn.value_and_grad(model, compute_loss, return_outputs=True)

    def train_step(inputs):
        images, labels = inputs
        loss, grads, predictions = grad_fn(images, labels)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        train_accuracy.update_state(labels, predictions)
        return loss

    def distributed_train_step(inputs):
        per_replica_losses = strategy.run(train_step, args=(inputs,))
        return strategy.reduce(hd.ReduceOp.SUM, per_replica_losses, axis=None)

    for epoch in range(EPOCHS):
        total_loss, num_batches = 0.0, 0
        for batch in dist_dataset:
            total_loss += float(distributed_train_step(batch))
            num_batches += 1
        accuracy = float(train_accuracy.result())
        train_accuracy.reset_state()
        if strategy.extended.should_checkpoint:
            print(
                f"epoch {epoch + 1}: loss {total_loss / num_batches:.4f}, accuracy {accuracy:.4f}"
            )


if __name__ == "__main__":
    main()
