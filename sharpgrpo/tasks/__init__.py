"""Small offline tasks beside the demo (``sharpgrpo.data.demo``), for comparing strategies on the tiny model.

They are a setting (``sharpgrpo.tasks.setting``, listed in ``sharpgrpo.settings.SETTING_MODULES``): the registries
of datasets, reward functions and evaluation tasks load them on their first lookup, like the search setting.
"""
