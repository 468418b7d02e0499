"""Running the policy model over a batch of rows, for generation and for the log-prob passes alike.

Each group's prompt computed once (`shared_prefix`) where the batch's `SharingPlan` says so (`sharing_plan`); whether
`generate` decodes from a static cache with a compiled step (`fast_generation`); frozen vision encoded once per
generation batch (`image_features`); a row's image inputs, tools' images included (`image_rows`); ZeRO-3 processes kept
in step when their rows hold different media (`vision_dummy`); LoRA aimed at the language model and the LM head's dtype
(`adapters`, `lm_head`).
"""
